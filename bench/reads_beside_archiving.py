#!/usr/bin/env python3
"""Random reads right after bench/nbd.py's write jobs, beside the archive
pass those leave (issue 13, req 4): Rewind builds side by side — the A/B
behind a by-hand section of BENCHMARKS.md, not a table of its own.

Each round, for each binary in turn (the order reverses every round): a
fresh server, a 1 GiB volume filled and archived; nbd.py's four write jobs
back to back (10 s each); 4 KiB random reads at depth 32 for 10 s right
after them, with the volume's stats before and after (the destager's
backlog, the archive pass under way, its waits); then, everything
archived, the same reads rested. The ratio is the first ÷ the second.

Reads right after writes hold an archive pass only while the history
waiting fits the disk's free space above twice the reserve. `--reserve 13%`
(passed on with --server-option) leaves it too little room, as on a disk
other work fills: the pass then goes on beside the reads.

    python3 bench/reads_beside_archiving.py BEFORE AFTER --rounds 2 --server-option=--reserve --server-option=13%"""

import argparse
import os
import statistics
import subprocess
from pathlib import Path

import benchlib

WRITE_JOBS = [
    ("seqwrite-1m", ["--rw=write", "--bs=1m", "--iodepth=4"]),
    ("randwrite-4k-qd1", ["--rw=randwrite", "--bs=4k", "--iodepth=1"]),
    ("randwrite-4k-qd32", ["--rw=randwrite", "--bs=4k", "--iodepth=32"]),
    ("randwrite-4k-flush8", ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=8"]),
]
RANDOM_READS = ["--rw=randread", "--bs=4k", "--iodepth=32"]


def cpu_seconds(pid):
    """CPU seconds (user + system) of process `pid` so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(binary, args):
    """(reads right after the writes, rested reads) in MiB/s, printing what
    the volume's background work did meanwhile."""
    benchlib.REWIND = Path(binary)
    server, http, uri = benchlib.serve_volume(
        args.work_dir, 12811, 12812, "v", 1 << 30, ["--archive-interval", "5s", *args.server_option]
    )
    try:
        benchlib.fio(uri, "fill", ["--rw=write", "--bs=1m", "--iodepth=4"], "1G")
        subprocess.run(["sync"], check=True)
        benchlib.wait_archived(http, "v")
        for name, job in WRITE_JOBS:
            benchlib.fio(uri, name, job, "1G", runtime=10)
        before, cpu_before = benchlib.api(http, "GET", "/v1/volumes/v")["stats"], cpu_seconds(server.process.pid)
        right_after = benchlib.throughput(benchlib.fio(uri, "randread", RANDOM_READS, "1G", runtime=10), "read")
        after, cpu_after = benchlib.api(http, "GET", "/v1/volumes/v")["stats"], cpu_seconds(server.process.pid)
        print(
            f"  right after the writes: {right_after / 2**20:.0f} MiB/s, server {cpu_after - cpu_before:.1f} CPU-s; "
            f"blocks to destage {before['versions_pending_destage']} -> {after['versions_pending_destage']}; "
            f"versions in the pass under way {before['versions_archiving']} -> {after['versions_archiving']}; "
            f"the pass's waits beside the reads {after.get('archive_yields', 'n/a')}",
            flush=True,
        )
        subprocess.run(["sync"], check=True)
        benchlib.wait_archived(http, "v")
        rested = benchlib.throughput(benchlib.fio(uri, "randread", RANDOM_READS, "1G", runtime=10), "read")
    finally:
        server.stop()
    return right_after / 2**20, rested / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binaries", nargs="+", help="rewind binaries to compare")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server-option", action="append", default=[], help="an option for `rewind serve`")
    parser.add_argument("--work-dir", default="/var/tmp/rewind-reads-beside-archiving")
    args = parser.parse_args()
    results = {binary: [] for binary in args.binaries}
    for round_ in range(args.rounds):
        for binary in args.binaries if round_ % 2 == 0 else list(reversed(args.binaries)):
            print(f"round {round_} {binary}", flush=True)
            right_after, rested = one_run(binary, args)
            results[binary].append((right_after, rested, right_after / rested))
            print(f"round {round_} {binary}: {right_after:.0f} ÷ {rested:.0f} MiB/s = {right_after / rested:.2f}",
                  flush=True)
    for binary, figures in results.items():
        ratios = [ratio for _, _, ratio in figures]
        print(f"{binary}: right after ÷ rested min / median / max "
              f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}")


if __name__ == "__main__":
    main()
