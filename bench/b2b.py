#!/usr/bin/env python3
"""bench/nbd.py's jobs back to back on one Rewind server, with what the
background threads did during each (issue 13, req 4): a diagnosis, not a
table for BENCHMARKS.md.

A fresh server (`--archive-interval 5s`) and a 1 GiB volume, filled; each
job once from rest (the destager and the archiver caught up, `sync`), then
all of them back to back. Per job it prints the throughput, the CPU each
server thread that outlives it used (from /proc/PID/task/*/stat: the
maintenance, journal and history threads; an NBD connection's end with
it), the server's minor page faults (fresh memory), the disk's bytes read
and written (/proc/diskstats) and, after it, the volume's destaging
backlog, checkpoints and destage passes stopped for reads, and the node's garbage
collections and versions archived during it. Compare two builds by
running it once per binary, alternating (`--binary`), or two server
settings (`--server-option`).

`--bookmark` sets the scene as bench/nbd.py does before its back-to-back
jobs: a bookmark, every block overwritten once in random order, and the
bookmark's history archived and laid out by the server before the rested
jobs (the settle time is printed). `--rested-rounds 2` runs the rested
jobs twice: the first round on a fresh server fills the journal's memory
for the first time (BENCHMARKS.md)."""

import argparse
import os
import shutil
import subprocess
import time
from pathlib import Path

import benchlib
from benchlib import api, fio, remember_token, start_server, wait_port

NBD_PORT, HTTP_PORT = 10977, 10978

# bench/nbd.py's jobs, in its back-to-back order.
JOBS = [
    ("seqwrite-1m", ["--rw=write", "--bs=1m", "--iodepth=4"], "write"),
    ("randwrite-4k-qd1", ["--rw=randwrite", "--bs=4k", "--iodepth=1"], "write"),
    ("randwrite-4k-qd32", ["--rw=randwrite", "--bs=4k", "--iodepth=32"], "write"),
    ("randwrite-4k-flush8", ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=8"], "write"),
    ("randread-4k-qd32", ["--rw=randread", "--bs=4k", "--iodepth=32"], "read"),
    ("seqread-1m", ["--rw=read", "--bs=1m", "--iodepth=4"], "read"),
]


def thread_cpu_seconds(pid):
    """CPU seconds per live server thread name (the NBD connections' together)."""
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        name = "nbd-conn" if name.startswith("nbd-conn") else name
        fields = stat.rsplit(")", 1)[1].split()
        seconds[name] = seconds.get(name, 0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def minor_faults(pid):
    """The server's minor page faults so far (fresh memory touched first)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def disk_bytes(device):
    """Bytes read and written so far by `device` (a name in /proc/diskstats)."""
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if fields[2] == device:
            return int(fields[5]) * 512, int(fields[9]) * 512
    raise SystemExit(f"no device {device} in /proc/diskstats: name the data directory's disk with --device")


def data_device(path):
    """The disk under `path`: its partition's parent, as /proc/diskstats names it."""
    source = subprocess.run(["findmnt", "-n", "-o", "SOURCE", "--target", path], check=True,
                            capture_output=True, text=True).stdout.strip()
    parent = subprocess.run(["lsblk", "-n", "-o", "PKNAME", source], capture_output=True, text=True).stdout.strip()
    return parent or Path(source).name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", type=Path, default=benchlib.REWIND)
    parser.add_argument("--work", default="/var/tmp/rewind-b2b",
                        help="the server's work directory (emptied, and removed at the end)")
    parser.add_argument("--device", help="the disk to count bytes of (default: the one under --work)")
    parser.add_argument("--runtime", type=int, default=10, help="seconds per job")
    parser.add_argument("--size", default="1G")
    parser.add_argument("--skip", action="append", default=[], metavar="JOB", help="a job to leave out")
    parser.add_argument("--bookmark", action="store_true",
                        help="a bookmark before a random overwrite of the whole volume, as in bench/nbd.py")
    parser.add_argument("--rested-rounds", type=int, default=1,
                        help="the rested jobs this many times (the first on a fresh server fills its memory)")
    parser.add_argument("--server-option", action="append", default=[], metavar="OPTION",
                        help="one more `rewind serve` option (e.g. --server-option=--no-bookmark-layout)")
    args = parser.parse_args()
    benchlib.REWIND = args.binary
    jobs = [job for job in JOBS if job[0] not in args.skip]
    _work, data, server = start_server(args.work, NBD_PORT, HTTP_PORT, ["--archive-interval", "5s", *args.server_option])
    device = args.device or data_device(str(data))
    try:
        wait_port(NBD_PORT)
        http = f"127.0.0.1:{HTTP_PORT}"
        remember_token(http, data)
        api(http, "POST", "/v1/volumes", {"name": "bench", "size_bytes": benchlib.size_of(args.size)})
        uri = f"nbd://127.0.0.1:{NBD_PORT}/bench"
        fio(uri, "fill", ["--rw=write", "--bs=1m", "--iodepth=4"], args.size)
        if args.bookmark:
            api(http, "POST", "/v1/volumes/bench/bookmarks", {"name": "before-overwrite"})
            fio(uri, "overwrite", ["--rw=randwrite", "--bs=4k", "--iodepth=32"], args.size)

        def stats():
            return api(http, "GET", "/v1/volumes/bench")["stats"]

        def settle():
            start = time.perf_counter()
            subprocess.run(["sync"], check=True)
            while True:
                now = stats()
                waiting = ("versions_in_journal", "bookmarks_awaiting_layout", "journal_bytes_reclaimable",
                           "journal_spares_owed")
                if now["versions_pending_destage"] == 0 and all(now.get(name, 0) == 0 for name in waiting):
                    break
                time.sleep(0.05)
            print(f"settled in {time.perf_counter() - start:.1f} s", flush=True)

        def node_counts():
            node, volume = api(http, "GET", "/v1/stats"), stats()
            return node["collections"], node["chunks_freed"], volume["versions_archived"]

        def run(name, job_args, direction, label):
            cpu_before, disk_before = thread_cpu_seconds(server.process.pid), disk_bytes(device)
            counts_before, faults_before = node_counts(), minor_faults(server.process.pid)
            job = fio(uri, name, job_args, args.size, runtime=args.runtime)
            cpu_after, disk_after = thread_cpu_seconds(server.process.pid), disk_bytes(device)
            collections, freed, archived = (after - before for after, before in zip(node_counts(), counts_before))
            faults = minor_faults(server.process.pid) - faults_before
            cpu = {thread: round(seconds - cpu_before.get(thread, 0), 1) for thread, seconds in cpu_after.items()
                   if seconds - cpu_before.get(thread, 0) >= 0.2}
            read, written = ((after - before) / 2**20 for after, before in zip(disk_after, disk_before))
            print(f"{label:8} {name:22} {job[direction]['bw_bytes'] / 2**20:8.1f} MiB/s  "
                  f"disk r {read:6.0f} w {written:6.0f} MiB  minor faults {faults}  cpu {cpu}", flush=True)
            after = stats()
            print(f"{'':8} pending destage {after['versions_pending_destage']}, "
                  f"checkpoints {after['checkpoints']}, destage passes stopped {after.get('destage_stops')}, "
                  f"collections {collections} ({freed} chunks freed), versions archived {archived}",
                  flush=True)

        for rested_round in range(args.rested_rounds):
            for name, job_args, direction in jobs:
                settle()
                run(name, job_args, direction, "rested" if rested_round == 0 else f"rested{rested_round + 1}")
        settle()
        for name, job_args, direction in jobs:
            run(name, job_args, direction, "b2b")
    finally:
        server.stop()
        # Its history runs to tens of GiB after a few seqwrite jobs.
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
