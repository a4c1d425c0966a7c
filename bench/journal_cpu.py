#!/usr/bin/env python3
"""Two or more Rewind builds side by side on journal.py's NBD job (issue 13,
req 1): throughput and the server's CPU per GiB written — a diagnosis for
the by-hand sections of BENCHMARKS.md, not a table of its own.

One server per build, all started at once on the same disk. Each round, for
each server in turn (the order alternates between rounds): a new 1 GiB
volume, one pass of 1 MiB sequential writes with a final flush (fio
`--rw=write --bs=1m --iodepth=4 --end_fsync=1`), the server process's CPU
time (`/proc/PID/stat`, all threads) around it, then the volume archived and
deleted. On a machine whose cores fio shares, the server's CPU per GiB is
what sets the pace once the disk keeps up.

Usage: python3 bench/journal_cpu.py [--rounds 8] BINARY BINARY...
"""

import argparse
import os
import statistics

import benchlib
from benchlib import api, fio, remember_token, start_server, wait_archived, wait_port
from present_cpu import cpu_seconds

PORT_FIRST = 12001
JOB = ["--rw=write", "--bs=1m", "--iodepth=4", "--end_fsync=1"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-journal-cpu")
    args = parser.parse_args()
    servers = []
    try:
        for index, binary in enumerate(args.binaries):
            benchlib.REWIND = binary
            nbd, http = PORT_FIRST + 2 * index, PORT_FIRST + 2 * index + 1
            _, data, server = start_server(f"{args.dir}/{index}", nbd, http)
            servers.append((binary, server, nbd, f"127.0.0.1:{http}"))
            wait_port(nbd)
            remember_token(f"127.0.0.1:{http}", data)
        figures = {binary: [] for binary in args.binaries}
        for round_ in range(args.rounds):
            for binary, server, nbd, http in servers if round_ % 2 == 0 else servers[::-1]:
                volume = f"round{round_}"
                api(http, "POST", "/v1/volumes", {"name": volume, "size_bytes": 1 << 30})
                before = cpu_seconds(server.process.pid)
                written = fio(f"nbd://127.0.0.1:{nbd}/{volume}", volume, JOB, "1G")["write"]
                cpu = (cpu_seconds(server.process.pid) - before) / (written["io_bytes"] / 2**30)
                figures[binary].append((written["bw_bytes"] / 2**20, cpu))
                print(f"round {round_} {binary}: {figures[binary][-1][0]:.0f} MiB/s, {cpu:.2f} CPU-s per GiB", flush=True)
                wait_archived(http, volume)
                api(http, "DELETE", f"/v1/volumes/{volume}")
    finally:
        for _, server, _, _ in servers:
            server.stop()
    for binary, runs in figures.items():
        mib_s, cpu = sorted(run[0] for run in runs), sorted(run[1] for run in runs)
        print(f"{binary}: MiB/s {mib_s[0]:.0f} / {statistics.median(mib_s):.0f} / {mib_s[-1]:.0f}, "
              f"CPU-s per GiB {cpu[0]:.2f} / {statistics.median(cpu):.2f} / {cpu[-1]:.2f} (min / median / max)")


if __name__ == "__main__":
    main()
