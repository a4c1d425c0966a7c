#!/usr/bin/env python3
"""What a burst of random writes leaves behind (issue 13, req 4): builds
compared, alternating, a fresh server per run — a diagnosis for the
by-hand sections of BENCHMARKS.md, not a table of its own.

Each run: a 1 GiB volume, filled with 1 MiB writes and destaged, then
4 KiB random writes at depth 1 and at depth 32 (`--runtime` seconds each),
then one of
- `read`: a 1 MiB sequential read (depth 4) right after them, then the
  same read once the volume is at rest (destaged, `sync`): the first as a
  share of the second;
- `destage`: nothing: the seconds until the idle server has destaged what
  the burst left, and the CPU-seconds its maintenance thread took.
Per build: min / median / max over the runs."""

import argparse
import os
import subprocess
import time
from pathlib import Path

import benchlib
from benchlib import fio, serve_volume, wait_destaged

NBD_PORT, HTTP_PORT = 10987, 10988
SEQREAD = ["--rw=read", "--bs=1m", "--iodepth=4"]


def thread_cpu_seconds(pid, name):
    """CPU seconds the server's threads called `name` have used."""
    seconds = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")] == name:
            fields = stat.rsplit(")", 1)[1].split()
            seconds += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def one_run(binary, mode, args):
    """One fresh server through the burst and `mode`: the figure it prints."""
    benchlib.REWIND = binary
    options = ["--archive-interval", "1h"]
    if args.journal_memory:
        options += ["--journal-memory", args.journal_memory]
    server, http, uri = serve_volume(args.work, NBD_PORT, HTTP_PORT, "bench", 1 << 30, options)
    try:
        fio(uri, "fill", ["--rw=write", "--bs=1m", "--iodepth=4"], "1G")
        wait_destaged(http, "bench")
        for depth in (1, 32):
            fio(uri, f"burst-qd{depth}", ["--rw=randwrite", "--bs=4k", f"--iodepth={depth}"], "1G",
                runtime=args.runtime)
        if mode == "destage":
            cpu, started = thread_cpu_seconds(server.process.pid, "maintenance"), time.monotonic()
            wait_destaged(http, "bench")
            return (time.monotonic() - started, thread_cpu_seconds(server.process.pid, "maintenance") - cpu)
        after = fio(uri, "seqread-after", SEQREAD, "1G", runtime=args.runtime)["read"]["bw_bytes"] / 2**20
        wait_destaged(http, "bench")
        subprocess.run(["sync"], check=True)
        rested = fio(uri, "seqread-rested", SEQREAD, "1G", runtime=args.runtime)["read"]["bw_bytes"] / 2**20
        return (after, rested)
    finally:
        server.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binaries", type=Path, nargs="+", help="the builds to compare")
    parser.add_argument("--mode", choices=["read", "destage"], default="read")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--runtime", type=int, default=10, help="seconds per fio job")
    parser.add_argument("--journal-memory", help="`rewind serve --journal-memory` (default: the build's own)")
    parser.add_argument("--work", default="/var/tmp/rewind-after-burst", help="the server's work directory (emptied)")
    args = parser.parse_args()
    figures = {binary: [] for binary in args.binaries}
    for run in range(args.runs):
        for binary in args.binaries:
            first, second = one_run(binary, args.mode, args)
            figures[binary].append((first, second))
            if args.mode == "read":
                print(f"run {run + 1} {binary}: right after {first:.0f} MiB/s, rested {second:.0f} MiB/s, "
                      f"share {first / second:.2f}", flush=True)
            else:
                print(f"run {run + 1} {binary}: destaged in {first:.1f} s, maintenance {second:.1f} CPU-s", flush=True)
    for binary, runs in figures.items():
        if args.mode == "read":
            shares = [first / second for first, second in runs]
            print(f"{binary}: read right after the burst ÷ rested {benchlib.spread(shares)}")
        else:
            print(f"{binary}: seconds to destage {benchlib.spread([first for first, _ in runs], 1)}, "
                  f"maintenance CPU-s {benchlib.spread([second for _, second in runs], 1)}")


if __name__ == "__main__":
    main()
