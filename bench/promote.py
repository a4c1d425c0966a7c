#!/usr/bin/env python3
"""Promoting a clone, and reading a volume after a revert (issue 12, reqs 3 and 4).

One Rewind server; each measurement starts once the server's background
archiving of what was just written has gone quiet.

Promote: a 1 GiB volume `base` with 768 MiB written sequentially by fio (the
rest a hole). Per run, a fresh clone of it at once, then in alternating
order: `rewind volume promote` of the clone (the base's branch point copied
into the clone, made durable) and `nbdcopy --flush` of the same point of
the base (`base@T` over NBD) to a file on the same filesystem — copying the
same bytes out of Rewind with the tool a user would pick. MiB/s of the
volume's size, and promote ÷ nbdcopy.

Reads after a revert: a 1 GiB volume `reverted`, 512 MiB written, bookmarked,
the same 512 MiB written again, then reverted to the bookmark. fio 1 MiB
sequential reads (QD 16) and 4 KiB random reads (QD 32) over those 512 MiB
before the revert (the present from the current store) and after the
background copy that follows the revert has put the reverted blocks back
into the current store (the IBM paper's copy after a revert); after ÷
before. The copy's time is measured from the revert's reply until the
server reports no block left to look at, with nothing else running.

Usage: python3 bench/promote.py [--runs 3] [--runtime 8]
"""

import argparse
import json
import shutil
import subprocess
import time

from benchlib import REWIND, api, environment, fio, remember_token, spread, start_server, timed, wait_archived, wait_port, write_section

NBD, HTTP = 10971, 10972
SIZE = 1 << 30
READS = {
    "read 1 MiB, QD 16": ["--rw=read", "--bs=1M", "--iodepth=16"],
    "randread 4 KiB, QD 32": ["--rw=randread", "--bs=4k", "--iodepth=32"],
}




def wait_copied(http, volume, timeout_seconds=300):
    """Waits for the background copy after `volume`'s revert to finish;
    returns the blocks it copied and the seconds it took."""
    start = time.monotonic()
    while True:
        stats = api(http, "GET", f"/v1/volumes/{volume}")["stats"]
        if stats["revert_copy_blocks_left"] == 0 and stats["revert_blocks_copied"] > 0:
            return {"blocks": stats["revert_blocks_copied"], "seconds": time.monotonic() - start}
        if time.monotonic() - start > timeout_seconds:
            raise RuntimeError(f"the copy after the revert of {volume} did not finish in {timeout_seconds} s")
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--runtime", type=int, default=8)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-promote")
    args = parser.parse_args()
    work, data, server = start_server(args.dir, NBD, HTTP)
    rewind = [str(REWIND), "--server", f"http://127.0.0.1:{HTTP}", "--data-dir", str(data)]
    seconds = {"promote": [], "nbdcopy": []}
    copied = []
    reads = {job: {"before": [], "after": []} for job in READS}
    copy = {}
    try:
        wait_port(NBD)
        http = f"127.0.0.1:{HTTP}"
        remember_token(http, data)
        api(http, "POST", "/v1/volumes", {"name": "base", "size_bytes": SIZE})
        fio(f"nbd://127.0.0.1:{NBD}/base", "fill", ["--rw=write", "--bs=1M", "--iodepth=8"], "768M")
        wait_archived(http, "base")
        for index in range(args.runs):
            clone = api(http, "POST", "/v1/volumes/base/clones", {"name": f"clone{index}"})
            point = f"nbd://127.0.0.1:{NBD}/base@{clone['base']['at']}"
            jobs = {
                "promote": [*rewind, "volume", "promote", f"clone{index}", "--json"],
                "nbdcopy": ["nbdcopy", "--flush", point, str(work / "copied.raw")],
            }
            for name in (list(jobs) if index % 2 == 0 else list(reversed(jobs))):
                (work / "copied.raw").unlink(missing_ok=True)
                subprocess.run(["sync"], check=True)
                took, output = timed(jobs[name])
                seconds[name].append(took)
                if name == "promote":
                    copied.append(json.loads(output)["bytes_copied"])
                print(f"run {index} {name:8}: {took:6.2f} s, {SIZE / took / (1 << 20):7.0f} MiB/s", flush=True)

        api(http, "POST", "/v1/volumes", {"name": "reverted", "size_bytes": SIZE})
        uri = f"nbd://127.0.0.1:{NBD}/reverted"
        fio(uri, "good", ["--rw=write", "--bs=1M", "--iodepth=8"], "512M")
        api(http, "POST", "/v1/volumes/reverted/bookmarks", {"name": "good"})
        fio(uri, "bad", ["--rw=write", "--bs=1M", "--iodepth=8", "--randseed=2"], "512M")
        wait_archived(http, "reverted")
        for state in ["before", "after"]:
            if state == "after":
                api(http, "POST", "/v1/volumes/reverted/revert", {"to": "good"})
                copy = wait_copied(http, "reverted")
                print(f"the copy after the revert: {copy['blocks']:,} blocks in {copy['seconds']:.2f} s", flush=True)
            for index in range(args.runs):
                for job, job_args in READS.items():
                    result = fio(uri, job.split()[0], job_args, "512M", runtime=args.runtime)
                    reads[job][state].append(result["read"]["bw_bytes"] / (1 << 20))
                    print(f"{state} revert, run {index}, {job}: {reads[job][state][-1]:7.0f} MiB/s", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    env = environment()
    mib_s = {name: [SIZE / took / (1 << 20) for took in values] for name, values in seconds.items()}
    ratios = [p / n for p, n in zip(mib_s["promote"], mib_s["nbdcopy"])]
    lines = [
        "<!-- promote:begin (written by bench/promote.py; do not edit by hand) -->",
        "## Promoting a clone, and reads after a revert (issue 12)",
        "",
        f"`python3 bench/promote.py --runs {args.runs} --runtime {args.runtime}` — {env['date']}, commit "
        f"{env['commit']}, {env['cpu']}, {env['memory']}, {env['fio']}, {env['nbdkit']}. A 1 GiB volume with "
        "768 MiB written (the rest a hole); per run a fresh clone of it, promoted, beside `nbdcopy --flush` of the "
        "same point of the base to a file on the same filesystem, in alternating order. MiB/s of the volume's "
        f"size (min / median / max over the runs); each promote copied {copied[0]:,} bytes.",
        "",
        "| copier | MiB/s | promote ÷ it |",
        "|---|---:|---:|",
        f"| `rewind volume promote` (the branch point into the clone, synced) | {spread(mib_s['promote'], 0)} | — |",
        f"| `nbdcopy --flush` of the same point to a file | {spread(mib_s['nbdcopy'], 0)} | {spread(ratios)} |",
        "",
        "Reads of 512 MiB of a volume before a revert of all of them (written twice, reverted to the first) and "
        "after the background copy that follows it: fio over NBD, MiB/s. The copy put "
        f"{copy['blocks'] * 4096 / (1 << 20):,.0f} MiB back into the current store in {copy['seconds']:.1f} s "
        f"({copy['blocks'] * 4096 / (1 << 20) / copy['seconds']:,.0f} MiB/s; passes of at most 512 MiB, a second apart).",
        "",
        "| job | before the revert | after it and its copy | after ÷ before |",
        "|---|---:|---:|---:|",
    ]
    for job in READS:
        before, after = reads[job]["before"], reads[job]["after"]
        lines.append(
            f"| {job} | {spread(before, 0)} | {spread(after, 0)} | "
            f"{spread([a / b for a, b in zip(after, before)])} |"
        )
    lines.append("<!-- promote:end -->")
    section = "\n".join(lines)
    print(section)
    write_section("promote", section)


if __name__ == "__main__":
    main()
