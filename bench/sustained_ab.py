#!/usr/bin/env python3
"""Rewind builds side by side on bench/nbd.py's sustained 1 MiB overwrite
(issue 13, req 1), its 4 KiB random writes at depth 32 (`--job rand`), or
bench/journal.py's one pass into a new volume (`--job pass`):
throughput, the server's CPU per GiB written and its minor page faults per
GiB — the A/B behind the by-hand sections of BENCHMARKS.md, not a table of
its own.

Each round, for each binary in turn (the order reverses every round): the
page cache dropped, a fresh server, a 1 GiB volume filled with 1 MiB writes,
destaged, archived and synced, then the job (fio 1 MiB writes at depth 4,
or 4 KiB random writes at depth 32) for --runtime s (2 s ramp). For `pass`
the volume is new, not filled, and written once with 1 MiB writes at depth
4 and a final fsync. With `--burst-before S`, after the fill an unmeasured
burst of the job's writes for S s, then rest again until the journal has
reclaimed what the burst wrote: the job then meets the spare segment files
the burst left, as a server that has run a while does. CPU and faults come
from `/proc/PID/stat` (all
threads), the ramp included. These machines drift between rounds: read the
binaries' ratios within a round, and the medians.

    python3 bench/sustained_ab.py BEFORE_BINARY AFTER_BINARY --rounds 4 [--job rand|pass] [--burst-before 4]"""

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import benchlib

JOBS = {
    "seq": ["--rw=write", "--bs=1m", "--iodepth=4"],
    "rand": ["--rw=randwrite", "--bs=4k", "--iodepth=32"],
    "pass": ["--rw=write", "--bs=1m", "--iodepth=4", "--end_fsync=1"],
}


def cpu_and_faults(pid):
    """CPU seconds (user + system) and minor faults of process `pid` so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def wait_reclaimed(http, volume, timeout_seconds=120):
    """Until the journal has reclaimed every segment whose history is
    archived (at the next checkpoint and archive pass)."""
    deadline = time.monotonic() + timeout_seconds
    while (stats := benchlib.api(http, "GET", f"/v1/volumes/{volume}/stats"))["journal_bytes_reclaimable"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the journal of {volume} was not reclaimed in {timeout_seconds} s: {stats}")
        time.sleep(0.5)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binaries", nargs="+", help="rewind binaries to compare")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runtime", type=int, default=10, help="seconds of the timed write job")
    parser.add_argument("--job", choices=sorted(JOBS), default="seq", help="the timed write job")
    parser.add_argument("--burst-before", type=int, default=0, metavar="SECONDS",
                        help="an unmeasured burst after the fill, then rest until its journal is reclaimed")
    parser.add_argument("--work-dir", default="/var/tmp/rewind-sustained-ab")
    args = parser.parse_args()
    results = {binary: [] for binary in args.binaries}
    one_pass = args.job == "pass"
    for round_ in range(args.rounds):
        for binary in args.binaries if round_ % 2 == 0 else list(reversed(args.binaries)):
            benchlib.REWIND = Path(binary)
            os.system("sync")
            benchlib.drop_caches()
            server, http, uri = benchlib.serve_volume(
                args.work_dir, 12801, 12802, "v", 1 << 30, ["--archive-interval", "5s"]
            )
            try:
                if not one_pass:
                    benchlib.fio(uri, "fill", ["--rw=write", "--bs=1m", "--iodepth=4"], "1G")
                    benchlib.wait_destaged(http, "v")
                    benchlib.wait_archived(http, "v")
                    if args.burst_before:
                        benchlib.fio(uri, "burst", JOBS[args.job], "1G", runtime=args.burst_before)
                        benchlib.wait_destaged(http, "v")
                        benchlib.wait_archived(http, "v")
                        wait_reclaimed(http, "v")
                    os.system("sync")
                cpu_before, faults_before = cpu_and_faults(server.process.pid)
                runtime = None if one_pass else args.runtime
                job = benchlib.fio(uri, args.job, JOBS[args.job], "1G", runtime=runtime)
                cpu_after, faults_after = cpu_and_faults(server.process.pid)
            finally:
                server.stop()
                # Each server's history is some GiB: gone before the next.
                shutil.rmtree(args.work_dir, ignore_errors=True)
            rate = benchlib.throughput(job, "write")
            gib = 1.0 if one_pass else rate * (args.runtime + 2) / 2**30
            figures = (rate / 2**20, (cpu_after - cpu_before) / gib, (faults_after - faults_before) / gib)
            results[binary].append(figures)
            print(f"round {round_} {binary}: {figures[0]:.0f} MiB/s, {figures[1]:.2f} CPU-s/GiB, "
                  f"{figures[2]:.0f} minor faults/GiB", flush=True)
    for binary, rows in results.items():
        for name, column in zip(("MiB/s", "CPU-s/GiB", "faults/GiB"), zip(*rows)):
            print(f"{binary} {name} min / median / max: "
                  f"{min(column):.2f} / {statistics.median(column):.2f} / {max(column):.2f}")


if __name__ == "__main__":
    main()
