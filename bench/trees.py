#!/usr/bin/env python3
"""File trees over NFS (issue 15, req 4: UCDP-I done right): a file written
fresh and read, then overwritten at random 4 KiB offsets and read again, on
Rewind's NFS server and on nfs-ganesha (VFS FSAL on a directory of the same
filesystem) side by side, by the same client (`tree-bench`, nfs3_client, one
request at a time). The paper's UCDP-I read a file 28x slower after random
overwrites; the target here is the read after overwrites at >= 0.9x the
fresh read. The device's own limit runs beside them: fio with direct I/O on
a file of the same size on the same filesystem, sequential 1 MiB writes and
reads and 4 KiB random writes one at a time. Writes its table to
BENCHMARKS.md.

    python3 bench/trees.py --runs 3 [--size-mib 500] [--overwrite-mib 16]

Needs root (nfs-ganesha and rpcbind), `apt install nfs-ganesha nfs-ganesha-vfs
rpcbind`, and `cargo build --release -p rewind-cli -p rewind-bench-trees`.
"""

import argparse
import json
import shutil
import statistics
import subprocess
from pathlib import Path

from benchlib import (ROOT, api, environment, fio, publish, remember_token, spread, start_ganesha, start_server,
                      stop_ganesha, throughput)

TREE_BENCH = ROOT / "target" / "release" / "tree-bench"
WORK = Path("/var/tmp/rewind-bench-trees")
NBD, HTTP, NFS = 11930, 11931, 11932
GANESHA_NFS, GANESHA_MOUNT = 20491, 20492



def tree_bench(nfs_port, mount_port, export, args):
    output = subprocess.run(
        [str(TREE_BENCH), "--nfs-port", str(nfs_port), "--mount-port", str(mount_port), "--export", export,
         "--file", "bench.bin", "--size-mib", str(args.size_mib), "--overwrite-mib", str(args.overwrite_mib)],
        check=True, capture_output=True, text=True, timeout=1800,
    ).stdout
    result = json.loads(output)
    assert result["verified"], result
    return result


def rewind_run(args):
    work, data, server = start_server(WORK / "rewind", NBD, HTTP, options=["--nfs", f"127.0.0.1:{NFS}"])
    try:
        remember_token(f"127.0.0.1:{HTTP}", data)
        api(f"127.0.0.1:{HTTP}", "POST", "/v1/volumes", {"name": "home", "size_bytes": 0, "tree": True})
        return tree_bench(NFS, NFS, "/home", args)
    finally:
        server.stop()


def ganesha_run(args):
    ganesha, export = start_ganesha(WORK / "ganesha", GANESHA_NFS, GANESHA_MOUNT)
    try:
        return tree_bench(GANESHA_NFS, GANESHA_MOUNT, str(export), args)
    finally:
        stop_ganesha(ganesha)


def device_run(args):
    """The device's limit for each measurement, in the same units."""
    WORK.mkdir(parents=True, exist_ok=True)
    path = str(WORK / "fio.bin")
    size = f"{args.size_mib}M"
    write = fio(path, "seq-write", ["--rw=write", "--bs=1M", "--iodepth=1"], size)
    read = fio(path, "seq-read", ["--rw=read", "--bs=1M", "--iodepth=1"], size)
    random = fio(path, "rand-write", ["--rw=randwrite", "--bs=4k", "--iodepth=1",
                                      f"--io_size={args.overwrite_mib}M"], size)
    again = fio(path, "seq-read-again", ["--rw=read", "--bs=1M", "--iodepth=1"], size)
    (WORK / "fio.bin").unlink()
    mib = 1 << 20
    return {
        "fresh_write_mib_s": throughput(write, "write") / mib,
        "fresh_read_mib_s": throughput(read, "read") / mib,
        "overwrite_writes_s": random["write"]["iops"],
        "overwritten_read_mib_s": throughput(again, "read") / mib,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=500)
    parser.add_argument("--overwrite-mib", type=int, default=16)
    args = parser.parse_args()
    env = environment()
    runs = {"rewind": [], "ganesha": [], "device": []}
    for run in range(args.runs):
        # Alternating, so drift in the machine falls on all.
        for name, one in (("rewind", rewind_run), ("ganesha", ganesha_run), ("device", device_run)):
            result = one(args)
            print(f"run {run + 1} {name}: {result}", flush=True)
            runs[name].append(result)
    shutil.rmtree(WORK, ignore_errors=True)

    def values(name, key):
        return [result[key] for result in runs[name]]

    def ratio(name):
        return [r["overwritten_read_mib_s"] / r["fresh_read_mib_s"] for r in runs[name]]

    rows = [
        ("sequential write of a fresh file, MiB/s", "fresh_write_mib_s", 0),
        ("sequential read of it, MiB/s", "fresh_read_mib_s", 0),
        ("random 4 KiB overwrites, writes/s", "overwrite_writes_s", 0),
        ("sequential read after them, MiB/s", "overwritten_read_mib_s", 0),
    ]
    lines = [
        "<!-- trees:begin (written by bench/trees.py; do not edit by hand) -->",
        "## File trees over NFS: reads after random overwrites (issue 15)",
        "",
        f"`python3 bench/trees.py --runs {args.runs} --size-mib {args.size_mib} --overwrite-mib {args.overwrite_mib}`"
        f" — {env['date']}, commit {env['commit']}, {env['cpu']}, {env['memory']}. One client (`bench/trees`,"
        " nfs3_client, one request at a time) on a file of its own: written in 1 MiB UNSTABLE WRITEs and"
        " committed, read in 1 MiB READs, overwritten at random 4 KiB offsets (UNSTABLE, then COMMIT), read"
        " again; every read checked against what was written. Rewind (`rewind serve`, a new tree each run)"
        " against nfs-ganesha (VFS FSAL on a directory of the same filesystem) and the device's own limit (fio,"
        " direct I/O on a file of the same size on the same filesystem: 1 MiB sequential writes and reads, 4 KiB"
        " random writes, one at a time), in turn; min / median / max.",
        "",
        "| measurement | Rewind | nfs-ganesha | device (fio direct) | Rewind ÷ ganesha | Rewind ÷ device |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, key, digits in rows:
        mine, theirs, device = values("rewind", key), values("ganesha", key), values("device", key)
        quotient = [a / b for a, b in zip(mine, theirs)]
        of_device = [a / b for a, b in zip(mine, device)]
        lines.append(
            f"| {label} | {spread(mine, digits)} | {spread(theirs, digits)} | {spread(device, digits)}"
            f" | {spread(quotient)} | {spread(of_device)} |"
        )
    ours = ratio("rewind")
    lines.append(
        f"| read after overwrites ÷ fresh read (target ≥ 0.9) | {spread(ours)} "
        f"({'met' if statistics.median(ours) >= 0.9 else 'missed'} at the median) | {spread(ratio('ganesha'))} | | | |"
    )
    lines.append("<!-- trees:end -->")
    publish("trees", lines)


if __name__ == "__main__":
    main()
