#!/usr/bin/env python3
"""Writes over NBD by build (issue 13, req 1): throughput and the server's
CPU per GiB written — a diagnosis for the by-hand sections of
BENCHMARKS.md, not a table of its own.

Per round and build (the builds alternate, the order turning each round): a
fresh server, a 1 GiB volume filled with 1 MiB writes, destaged and
archived, then one time-based fio job (`seq`: 1 MiB sequential writes at
depth 4; `rand`: 4 KiB random writes at depth 32). The server process's CPU
time (`/proc/PID/stat`, all threads) over the job, ramp included, divided by
the GiB the job wrote at its measured rate over the same time. On a machine
whose cores fio shares, the server's CPU per GiB is what sets the pace.

    python3 bench/write_cpu.py --rounds 4 --job seq OLD_BUILD NEW_BUILD
"""

import argparse
import shutil
import subprocess
from pathlib import Path

import benchlib
from benchlib import fio, serve_volume, spread, wait_archived, wait_destaged
from present_cpu import cpu_seconds

NBD, HTTP = 11990, 11991
RAMP_SECONDS = 2  # benchlib.fio's --ramp_time
JOBS = {"seq": ["--rw=write", "--bs=1m", "--iodepth=4"],
        "rand": ["--rw=randwrite", "--bs=4k", "--iodepth=32"]}


def one_job(build, args):
    """(MiB/s, server CPU-s per GiB) of one job on a fresh server."""
    shutil.rmtree(args.work, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    benchlib.REWIND = build
    server, http, uri = serve_volume(args.work, NBD, HTTP, "v", 1 << 30, ["--archive-interval", "5s"])
    try:
        fio(uri, "fill", JOBS["seq"], "1G")
        wait_destaged(http, "v")
        wait_archived(http, "v")
        subprocess.run(["sync"], check=True)
        before = cpu_seconds(server.process.pid)
        job = fio(uri, args.job, JOBS[args.job], "1G", runtime=args.runtime)["write"]
        mib_per_second = job["bw_bytes"] / 2**20
        gib = mib_per_second * (args.runtime + RAMP_SECONDS) / 1024
        return mib_per_second, (cpu_seconds(server.process.pid) - before) / gib
    finally:
        server.stop()
        shutil.rmtree(args.work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", type=Path, help="rewind binaries to compare")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--job", choices=sorted(JOBS), default="seq")
    parser.add_argument("--runtime", type=int, default=10, help="seconds per job after the ramp")
    parser.add_argument("--work", default="/var/tmp/rewind-write-cpu", help="the server's work directory (emptied)")
    args = parser.parse_args()
    figures = {build: [] for build in args.builds}
    for round_index in range(args.rounds):
        order = args.builds if round_index % 2 == 0 else args.builds[::-1]
        for build in order:
            mib_per_second, cpu = one_job(build, args)
            figures[build].append((mib_per_second, cpu))
            print(f"round {round_index} {build.name}: {mib_per_second:.0f} MiB/s, {cpu:.3f} CPU-s/GiB", flush=True)
    for build, pairs in figures.items():
        print(f"{build.name}: MiB/s {spread([pair[0] for pair in pairs], 0)}, "
              f"server CPU-s per GiB {spread([pair[1] for pair in pairs], 3)}")


if __name__ == "__main__":
    main()
