#!/usr/bin/env python3
"""The layouts against each other and against `nbdkit file`, in one run.

1. Xiao et al. §6.2, over NBD: fio random 4 KiB requests at queue depth 1
   (IoMeter's shape) at write ratios 0–100%, on COW and ROW volumes with
   snap_block 1, 2, 4, 8 and 64 KiB and a snapshot every second (granularity
   1s), against the same job on `nbdkit file`. Mean response time, and its
   ratio to nbdkit's at the same write ratio.
2. pgbench on ext4 on each layout (nbdfuse + a loop device), against ext4 on
   `nbdkit file`: transactions per second and their ratio.

Writes both tables into BENCHMARKS.md between the `layouts` markers. Not a
test: nothing fails on a number. Needs root (loop devices, mounts).

    python3 bench/layouts.py --runs 3
"""

import argparse
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from benchlib import REWIND, ROOT, Process, api, remember_token, environment, fio, wait_port, write_section

WRITE_RATIOS = [0, 20, 40, 60, 80, 100]
SNAP_BLOCKS_KIB = [1, 2, 4, 8, 64]
PGBENCH_LAYOUTS = ["journaled", "logging", "split-stream", "split-down-stream", "checkpointing", "cow", "row"]
NBD_PORT, HTTP_PORT, BASE_PORT = 10920, 10921, 10922


def mean_response_us(job):
    """Mean response time (submission to completion) over reads and writes, in µs."""
    total, count = 0.0, 0
    for direction in ("read", "write"):
        ios = job[direction]["total_ios"]
        if ios:
            total += job[direction]["lat_ns"]["mean"] * ios
            count += ios
    return total / count / 1000


def start_nbdkit(work, size):
    image = work / "nbdkit.img"
    with open(image, "wb") as f:
        f.truncate(size)
    process = Process(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(BASE_PORT), "file", str(image)])
    wait_port(BASE_PORT)
    return process, f"nbd://127.0.0.1:{BASE_PORT}/"


def start_rewind(work, size, layout, block_bytes, granularity, binary):
    shutil.rmtree(work / "rewind", ignore_errors=True)
    process = Process(
        [str(binary), "serve", "--data-dir", str(work / "rewind"), "--nbd", f"127.0.0.1:{NBD_PORT}",
         "--http", f"127.0.0.1:{HTTP_PORT}"],
        ready_pattern=[r"listening http"],
        env={**os.environ, "RUST_LOG": "warn"},
    )
    http = f"127.0.0.1:{HTTP_PORT}"
    remember_token(http, work / "rewind")
    api(http, "POST", "/v1/volumes", {"name": "bench", "size_bytes": size, "block_size": block_bytes,
                                      "layout": layout, "granularity": granularity})
    return process, f"nbd://127.0.0.1:{NBD_PORT}/bench"


def iometer_like(uri, size, ratio, runtime):
    args = ["--rw=randrw", f"--rwmixwrite={ratio}", "--bs=4k", "--iodepth=1"]
    return mean_response_us(fio(uri, f"mix-{ratio}", args, size, runtime=runtime))


def start(target, work, size, block_bytes, args):
    """`nbdkit file`, or Rewind with a volume of layout `target`."""
    if target == "nbdkit":
        return start_nbdkit(work, size)
    return start_rewind(work, size, target, block_bytes, "1s", args.rewind)


def snapshots_run(args, run_index, results):
    """Per snap_block: nbdkit, COW and ROW, each filled, then every write
    ratio; the order alternates between runs."""
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    size = args.size_mib << 20
    fill = ["--rw=write", "--bs=1m", "--iodepth=4"]
    for snap_kib in SNAP_BLOCKS_KIB:
        targets = ["nbdkit", "cow", "row"]
        if run_index % 2:
            targets.reverse()
        for target in targets:
            server, uri = start(target, work, size, snap_kib << 10, args)
            try:
                fio(uri, "fill", fill, size)
                for ratio in WRITE_RATIOS:
                    value = iometer_like(uri, size, ratio, args.runtime)
                    results.setdefault((target, snap_kib, ratio), []).append(value)
                    print(f"run {run_index} {target:6} {snap_kib:2} KiB ratio {ratio:3}% {value:9.1f} µs", flush=True)
            finally:
                server.stop()
    shutil.rmtree(work, ignore_errors=True)


def sh(*command, **kwargs):
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout


def pgbench_on(uri, work, args):
    """ext4 on the export through nbdfuse and a loop device; PostgreSQL on it; pgbench's TPS."""
    fuse, mnt = work / "fuse", work / "mnt"
    for path in (fuse, mnt):
        path.mkdir(parents=True, exist_ok=True)
    pidfile = work / "nbdfuse.pid"
    pidfile.unlink(missing_ok=True)
    nbdfuse = subprocess.Popen(["nbdfuse", "-P", str(pidfile), str(fuse / "disk"), uri])
    loop = None
    try:
        deadline = time.time() + 30
        while not pidfile.exists():
            if time.time() > deadline:
                raise RuntimeError("nbdfuse did not start")
            time.sleep(0.05)
        loop = sh("losetup", "-f", "--show", str(fuse / "disk")).strip()
        sh("mkfs.ext4", "-q", loop)
        sh("mount", loop, str(mnt))
        pgdata = mnt / "pg"
        pgdata.mkdir()
        shutil.chown(pgdata, "postgres", "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
        sh(*as_postgres, "initdb", "-D", str(pgdata), "--no-sync")
        options = "-p 5499 -k /tmp -c fsync=on -c synchronous_commit=on -c shared_buffers=64MB -c max_wal_size=256MB"
        # The server outlives pg_ctl: its output goes to a file, not to our pipes.
        log = pgdata / "server.log"
        subprocess.run([*as_postgres, "pg_ctl", "-D", str(pgdata), "-o", options, "-l", str(log), "-w", "start"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            sh(*as_postgres, "pgbench", "-h", "/tmp", "-p", "5499", "-i", "-q", "-s", str(args.scale), "postgres")
            output = sh(*as_postgres, "pgbench", "-h", "/tmp", "-p", "5499", "-c", "4", "-j", "2",
                        "-T", str(args.pgbench_seconds), "postgres")
        finally:
            sh(*as_postgres, "pg_ctl", "-D", str(pgdata), "-m", "fast", "-w", "stop")
        return float(re.search(r"tps = ([0-9.]+)", output).group(1))
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        subprocess.run(["fusermount3", "-u", str(fuse)], capture_output=True)
        nbdfuse.wait(timeout=60)


def pgbench_run(args, run_index, results):
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    size = args.pg_size_mib << 20
    targets = ["nbdkit", *PGBENCH_LAYOUTS]
    if run_index % 2:
        targets.reverse()
    for target in targets:
        server, uri = start(target, work, size, 4096, args)
        try:
            tps = pgbench_on(uri, work / "fs", args)
        finally:
            server.stop()
        results.setdefault(target, []).append(tps)
        print(f"run {run_index} pgbench {target:10} {tps:8.1f} tps", flush=True)
    shutil.rmtree(work, ignore_errors=True)


def spread(values):
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def table(args, snapshots, pgbench, env):
    lines = [
        "<!-- layouts:begin (written by bench/layouts.py; edits are overwritten) -->",
        "## Layouts: COW and ROW (Xiao §6.2), pgbench per layout",
        "",
        f"{env['date']}, commit {env['commit']}, {env['cpu']}, {env['memory']}, kernel {env['kernel']}, "
        f"{env['fio']}, {env['nbdkit']}. {args.runs} runs, interleaved; min / median / max.",
        "",
        f"### Response time by write ratio (fio randrw 4 KiB, queue depth 1, {args.size_mib} MiB volume, "
        f"{args.runtime} s per point, a snapshot every second)",
        "",
        "Mean response time as a ratio to `nbdkit file` at the same write ratio, measured beside each "
        "snap_block size (lower is faster); nbdkit's own in µs. The CPUs are held out of idle states "
        "(`/dev/cpu_dma_latency` 0) for the whole run: at queue depth 1 a wake-up otherwise costs more "
        "than the I/O.",
        "",
        "| layout | snap_block | " + " | ".join(f"{ratio}% writes" for ratio in WRITE_RATIOS) + " |",
        "|---|---|" + "---|" * len(WRITE_RATIOS),
    ]
    for snap_kib in SNAP_BLOCKS_KIB:
        base = {ratio: statistics.median(snapshots[("nbdkit", snap_kib, ratio)]) for ratio in WRITE_RATIOS}
        lines.append(f"| nbdkit file (µs) | (beside {snap_kib} KiB) | " + " | ".join(
            f"{base[ratio]:.0f}" for ratio in WRITE_RATIOS) + " |")
        for layout in ("cow", "row"):
            cells = []
            for ratio in WRITE_RATIOS:
                cells.append(spread([value / base[ratio] for value in snapshots[(layout, snap_kib, ratio)]]))
            lines.append(f"| {layout} | {snap_kib} KiB | " + " | ".join(cells) + " |")
    lines += ["", "Where COW and ROW cross (by medians):", ""]
    for snap_kib in SNAP_BLOCKS_KIB:
        cow = [statistics.median(snapshots[("cow", snap_kib, ratio)]) for ratio in WRITE_RATIOS]
        row = [statistics.median(snapshots[("row", snap_kib, ratio)]) for ratio in WRITE_RATIOS]
        # The least write ratio from which ROW stays faster.
        threshold = None
        for ratio, c, r in reversed(list(zip(WRITE_RATIOS, cow, row))):
            if r >= c:
                break
            threshold = ratio
        faster = ", ".join(f"{ratio}%" for ratio, c, r in zip(WRITE_RATIOS, cow, row) if r < c) or "none"
        where = f"stays faster from {threshold}% writes on" if threshold is not None else "is slower at 100% writes"
        lines.append(f"- snap_block {snap_kib} KiB: ROW {where}; faster at {faster} "
                     f"(COW/ROW at 0%: {cow[0] / row[0]:.2f}, at 100%: {cow[-1] / row[-1]:.2f})")
    lines += [
        "",
        f"### pgbench on ext4 (scale {args.scale}, 4 clients, {args.pgbench_seconds} s, fsync on; "
        f"{args.pg_size_mib} MiB volume through nbdfuse and a loop device)",
        "",
        "| target | TPS (median) | ratio to nbdkit file, min / median / max |",
        "|---|---|---|",
    ]
    base_tps = statistics.median(pgbench["nbdkit"])
    lines.append(f"| nbdkit file | {base_tps:.0f} | 1 |")
    for layout in PGBENCH_LAYOUTS:
        lines.append(f"| {layout} (granularity 1s) | {statistics.median(pgbench[layout]):.0f} | "
                     f"{spread([tps / base_tps for tps in pgbench[layout]])} |")
    lines.append("<!-- layouts:end -->")
    return "\n".join(lines)


def hold_cpus_awake():
    """Keeps the CPUs out of idle states while the file stays open (PM QoS
    `cpu_dma_latency` 0): at queue depth 1 on this VM, waking an idle CPU
    otherwise costs more than the I/O (nbdkit's mean read time halves), and
    any server with a background thread would look faster than it is."""
    qos = open("/dev/cpu_dma_latency", "wb", buffering=0)
    qos.write(struct.pack("i", 0))
    return qos


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runtime", type=int, default=6)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--pgbench-seconds", type=int, default=20)
    parser.add_argument("--pg-size-mib", type=int, default=1024)
    parser.add_argument("--dir", default=str(ROOT / "target" / "bench-layouts"))
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--rewind", default=str(REWIND), help="the rewind binary to run")
    args = parser.parse_args()
    for tool in ["fio", "nbdkit", "nbdfuse", "pgbench", "initdb", "runuser"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install fio nbdkit nbdfuse postgresql")
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "rewind-cli"], cwd=ROOT, check=True)
    env = environment()
    awake = hold_cpus_awake()
    snapshots, pgbench = {}, {}
    for run_index in range(args.runs):
        snapshots_run(args, run_index, snapshots)
        pgbench_run(args, run_index, pgbench)
    awake.close()
    section = table(args, snapshots, pgbench, env)
    write_section("layouts", section)
    print(section)


if __name__ == "__main__":
    main()
