#!/usr/bin/env python3
"""A burst after a rest, with the journal's spare segment files written in
place of those the chunk store adopted, and without them (issue 13, req 1).

History written in runs that neither dedups nor compresses stays where the
journal wrote it (the chunk store adopts the segment file), so that file is
never reused; by default the journal writes a spare of zeros in its place
while the volume is idle, so that the next burst writes into written blocks
rather than new ones. `rewind serve --no-journal-spares-ahead` leaves them
out. This runs both, alternating, each on a fresh server (`--archive-interval
5s`) with a 1 GiB volume filled with 1 MiB writes, then `--bursts` times:
the server brought to rest (destaged, archived, the segments holding only
archived history given back or kept, and the spares owed written), then
fio's 1 MiB sequential write at depth 4 for `--runtime` s after a 2 s ramp.
The journal keeps as many spares as the largest burst of the last hour
took, so the first burst finds only the fill's 16; the later bursts are the
ones compared. A third setting stops the server (SIGTERM) and starts it
again after each rest, before the burst: the spares outlive the restart,
wiped (their blocks made unwritten, not given back), and stand for the
demand. `--binary` runs another build (one from before, whose recovery
deleted the spares), `--settings` some of the three. Beside them, in the
same run, the device's own limits: the
same fio job with direct I/O and `--fdatasync=4` on a file written before,
and in one pass of 4 GiB into a new file allocated as a journal segment is
(a time-based job would loop over blocks it has written).

Usage: python3 bench/spares.py [--runs 3] [--bursts 3] [--runtime 4] [--binary B] [--settings NAME ...]
"""

import argparse
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import benchlib
from benchlib import api, environment, fio, publish, remember_token, spread, start_server, throughput, wait_port

NBD, HTTP = 10997, 10998
WITH, RESTARTED, WITHOUT = "spares written at rest", "the same, restarted before each burst", "--no-journal-spares-ahead"
# Each setting's `rewind serve` options, and whether the server restarts before each burst.
SETTINGS = {WITH: ([], False), RESTARTED: ([], True), WITHOUT: (["--no-journal-spares-ahead"], False)}
JOB = ["--rw=write", "--bs=1m", "--iodepth=4"]
MIB = 2**20


def device(path, runtime, new):
    """The device's 1 MiB direct write with a sync every 4 MiB, on a file
    written before, or in one pass into a new one allocated as a journal
    segment is."""
    path.unlink(missing_ok=True)
    try:
        if new:
            job = fio(str(path), "device-new", [*JOB, "--fdatasync=4", "--fallocate=keep"], "4G")
        else:
            fio(str(path), "device-prepare", ["--rw=write", "--bs=4m", "--iodepth=2"], "2G")
            job = fio(str(path), "device", [*JOB, "--fdatasync=4"], "2G", runtime=runtime)
    finally:
        path.unlink(missing_ok=True)
    return throughput(job, "write") / MIB


def rest(http):
    """Until the server is at rest: destaged, archived, the journal's
    segments that hold only archived history given back or kept (at a
    checkpoint), and the spares owed written."""
    waiting = ("versions_pending_destage", "versions_in_journal", "journal_bytes_reclaimable", "journal_spares_owed")
    subprocess.run(["sync"], check=True)
    while any(api(http, "GET", "/v1/volumes/v")["stats"][name] for name in waiting):
        time.sleep(0.05)


def bursts(work, setting, count, runtime):
    """One fresh server: per burst, (MiB/s, seconds the rest took, spare
    files at its start); and the bytes of zeros written into spares."""
    options, restart = SETTINGS[setting]
    options = ["--archive-interval", "5s", *options]
    http = f"127.0.0.1:{HTTP}"

    def started(fresh):
        _work, data, server = start_server(work, NBD, HTTP, options, fresh=fresh)
        wait_port(NBD)
        remember_token(http, data)
        return data, server

    data, server = started(fresh=True)
    # The server counts the zeros since it started: those of the servers before a restart.
    zeros_before = 0
    try:
        api(http, "POST", "/v1/volumes", {"name": "v", "size_bytes": 1 << 30})
        uri = f"nbd://127.0.0.1:{NBD}/v"
        fio(uri, "fill", JOB, "1G")
        results = []
        for index in range(count):
            start = time.perf_counter()
            rest(http)
            if restart and index > 0:
                zeros_before += api(http, "GET", "/v1/volumes/v")["stats"]["journal_spare_bytes_written"]
                server.stop()
                data, server = started(fresh=False)
                rest(http)
            rested = time.perf_counter() - start
            spares = sum(1 for path in (data / "volumes" / "v" / "journal").iterdir()
                         if path.name.startswith("spare-"))
            job = fio(uri, "burst", JOB, "1G", runtime=runtime)
            results.append((throughput(job, "write") / MIB, rested, spares))
        zeros = zeros_before + api(http, "GET", "/v1/volumes/v")["stats"]["journal_spare_bytes_written"]
        return results, zeros
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--runtime", type=int, default=4)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-spares")
    parser.add_argument("--binary", type=Path, default=benchlib.REWIND)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    args = parser.parse_args()
    assert args.bursts >= 2, "the bursts after the first are the ones compared"
    benchlib.REWIND = args.binary
    settings = [name for name in SETTINGS if name in args.settings]
    work = Path(args.dir)
    measured = {name: {"later": [], "first": [], "rest": [], "spares": [], "zeros": []} for name in settings}
    devices = {"written": [], "new": []}
    # Per run, each setting's median of the later bursts.
    medians = []
    for run in range(args.runs):
        work.mkdir(parents=True, exist_ok=True)
        for kind in (["written", "new"] if run % 2 == 0 else ["new", "written"]):
            devices[kind].append(device(work / "device-file", args.runtime, kind == "new"))
        names = settings if run % 2 == 0 else list(reversed(settings))
        medians.append({})
        for name in names:
            results, zeros = bursts(str(work / "server"), name, args.bursts, args.runtime)
            entry = measured[name]
            entry["first"].append(results[0][0])
            entry["later"] += [speed for speed, _, _ in results[1:]]
            entry["rest"] += [rest for _, rest, _ in results[1:]]
            entry["spares"] += [spares for _, _, spares in results[1:]]
            entry["zeros"].append(zeros / 2**30)
            medians[-1][name] = statistics.median(speed for speed, _, _ in results[1:])
            shown = ", ".join(f"{speed:.0f} MiB/s after {rest:.1f} s at rest, {spares} spares"
                              for speed, rest, spares in results)
            print(f"run {run} {name:26} {shown}; zeros {zeros / 2**30:.1f} GiB", flush=True)
        print(f"run {run} device: written {devices['written'][-1]:.0f}, new {devices['new'][-1]:.0f} MiB/s",
              flush=True)
    env = environment()
    written, new = statistics.median(devices["written"]), statistics.median(devices["new"])
    lines = [
        "<!-- spares:begin (written by bench/spares.py; do not edit by hand) -->",
        "## A burst after a rest (or a restart), with and without the journal's spares (issue 13, req 1)",
        "",
        f"`python3 bench/spares.py --runs {args.runs} --bursts {args.bursts} --runtime {args.runtime}` — "
        f"{env['date']}, commit {env['commit']}"
        + ("" if args.binary == benchlib.ROOT / "target" / "release" / "rewind" else f" (the server: `{args.binary}`)")
        + f", {env['cpu']}, {env['memory']}, {env['fio']}. Per run and setting "
        "(alternating), a fresh server and a 1 GiB volume filled with 1 MiB writes, then bursts of fio's 1 MiB "
        f"sequential write (depth 4, {args.runtime} s after a 2 s ramp), each after the server is brought to rest "
        "(destaged, archived, the journal's segments that hold only archived history given back or kept, and the "
        "spares owed written). The history is adopted by the chunk store, so its segment files are never reused; "
        "by default the journal writes a spare of zeros in place of each at rest, as many as the largest burst "
        "of the last hour took: the first burst finds the fill's 16, and the later ones are compared. The "
        "device: the same job with direct I/O and `--fdatasync=4` on a file written before "
        f"({written:.0f} MiB/s, median) and in one pass of 4 GiB into a new one allocated as a segment is "
        f"({new:.0f} MiB/s). *Restarted*: the server stopped (SIGTERM) and started again after each rest, "
        "before the burst.",
        "",
        "| setting | later bursts, MiB/s (min / median / max) | ÷ the device, written file (median) | "
        "÷ a new file (median) | first burst, MiB/s (median) | spare files at the burst's start | "
        "rest before it, s (median) | zeros written at rest per run, GiB |",
        "|---|---|---:|---:|---:|---|---:|---|",
    ]
    for name in settings:
        entry = measured[name]
        later = statistics.median(entry["later"])
        lines.append(
            f"| {name} | {spread(entry['later'], 0)} | {later / written:.2f} | {later / new:.2f} | "
            f"{statistics.median(entry['first']):.0f} | {min(entry['spares'])}–{max(entry['spares'])} | "
            f"{statistics.median(entry['rest']):.1f} | {spread(entry['zeros'], 1)} |")
    lines.append("")
    for numerator, denominator, text in [(WITH, WITHOUT, "With the spares ÷ without"),
                                         (RESTARTED, WITH, "Restarted ÷ not")]:
        if numerator in settings and denominator in settings:
            ratios = [run[numerator] / run[denominator] for run in medians]
            lines.append(f"{text}, per run (medians of the later bursts): {spread(ratios)}.")
    lines.append("<!-- spares:end -->")
    publish("spares", lines)


if __name__ == "__main__":
    main()
