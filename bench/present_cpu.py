#!/usr/bin/env python3
"""Rested 1 MiB sequential reads of the present, Rewind and `nbdkit file` in
turn (issue 13, req 5): throughput and the server's CPU per GiB read — a
diagnosis for the by-hand sections of BENCHMARKS.md, not a table of its own.

Each run, for each server in turn (the order alternates between runs): a
fresh server, a 1 GiB volume (or file) filled with 1 MiB writes, brought to
rest (Rewind: destaged) and synced, then two 8 s fio reads at depth 4; the
server process's CPU time (`/proc/PID/stat`, all threads) around each read,
divided by the GiB it served. On a machine whose cores fio shares, the
server's CPU per GiB is what sets the pace."""

import argparse
import os
import subprocess
from pathlib import Path

import benchlib
from benchlib import fio, serve_volume, wait_destaged, wait_port

REWIND_NBD, REWIND_HTTP, NBDKIT_NBD = 11960, 11961, 11970
SEQREAD = ["--rw=read", "--bs=1m", "--iodepth=4"]
FILL = ["--rw=write", "--bs=1m", "--iodepth=4"]


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reads(uri, pid, args):
    """(MiB/s, server CPU-s per GiB) of each read."""
    figures = []
    for _ in range(args.reads):
        before = cpu_seconds(pid)
        read = fio(uri, "seqread", SEQREAD, "1G", runtime=args.runtime)["read"]
        figures.append((read["bw_bytes"] / 2**20, (cpu_seconds(pid) - before) / (read["io_bytes"] / 2**30)))
    return figures


def rewind(args):
    server, http, uri = serve_volume(args.work, REWIND_NBD, REWIND_HTTP, "present", 1 << 30,
                                     ["--archive-interval", "1h"])
    try:
        fio(uri, "fill", FILL, "1G")
        wait_destaged(http, "present")
        subprocess.run(["sync"], check=True)
        return reads(uri, server.process.pid, args)
    finally:
        server.stop()


def nbdkit(args):
    Path(args.work).mkdir(parents=True, exist_ok=True)
    image = Path(args.work) / "nbdkit.img"
    image.unlink(missing_ok=True)
    subprocess.run(["truncate", "-s", "1G", str(image)], check=True)
    server = subprocess.Popen(["nbdkit", "-f", "-p", str(NBDKIT_NBD), "file", str(image)])
    try:
        wait_port(NBDKIT_NBD)
        uri = f"nbd://127.0.0.1:{NBDKIT_NBD}/"
        fio(uri, "fill", FILL, "1G")
        subprocess.run(["sync"], check=True)
        return reads(uri, server.pid, args)
    finally:
        server.terminate()
        server.wait()
        image.unlink(missing_ok=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", type=Path, default=benchlib.REWIND, help="the rewind build")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reads", type=int, default=2, help="reads per server and run")
    parser.add_argument("--runtime", type=int, default=8, help="seconds per read")
    parser.add_argument("--work", default="/var/tmp/rewind-present-cpu", help="the servers' work directory (emptied)")
    args = parser.parse_args()
    benchlib.REWIND = args.binary
    servers = [("rewind", rewind), ("nbdkit", nbdkit)]
    figures = {name: [] for name, _ in servers}
    for run in range(args.runs):
        for name, serve in servers if run % 2 == 0 else servers[::-1]:
            got = serve(args)
            figures[name].append(got)
            print(f"run {run + 1} {name}: " + ", ".join(f"{mib:.0f} MiB/s {cpu:.2f} CPU-s/GiB" for mib, cpu in got),
                  flush=True)
    ratios = [ours[0] / theirs[0] for run_ours, run_theirs in zip(figures["rewind"], figures["nbdkit"])
              for ours, theirs in zip(run_ours, run_theirs)]
    print(f"Rewind ÷ nbdkit per read: {benchlib.spread(ratios)}")
    for name, runs in figures.items():
        print(f"{name}: CPU-s per GiB read {benchlib.spread([cpu for run in runs for _, cpu in run])}")


if __name__ == "__main__":
    main()
