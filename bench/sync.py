#!/usr/bin/env python3
"""Commits at the disk's latency: the jobs that wait for a sync on every few
operations, against Rewind with its journal's spare segment files (as
shipped) and without (`--journal-spares 0`: every
segment a new file), beside `nbdkit file` and the disk itself, in one run.

A new segment file's blocks are allocated but unwritten, so every commit
into it makes ext4 convert the extent it wrote and commit its own journal;
a spare's blocks are written already (a reclaimed segment, or zeros written
ahead for a journal that commits often), and a commit into it is the data
write and one cache flush.

Per run, each server fresh (a new data directory, a new volume and tree),
in alternating order: every job once unmeasured, then the server's
background work let finish (history archived, segments reclaimed, spares
written ahead at the quiet moment: a server that has been running), then
the jobs measured:
- over NBD, fio 4 KiB random writes of a 256 MiB volume: `--fsync=1` at
  queue depth 1 (every write synced), and `--fsync=8` at depth 32;
- over NFS (`rewind serve` only), the SPECsfs-like mix of bench/trees
  (`nfs-mix`) at 96% and 60% updates, 4 clients;
- the disk: fio `--direct=1 --fsync=1` 4 KiB random writes on a file of the
  same filesystem (written first): the latency of one synced write;
- `nbdkit file` for the NBD jobs.
Operations per second (min / median / max), and spares ÷ no spares (the
ratio of each run's pair).

Needs `cargo build --release -p rewind-cli -p rewind-bench-trees`, fio and
nbdkit. Usage: python3 bench/sync.py [--runs 4] [--seconds 8]
"""

import argparse
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

from benchlib import (ROOT, TOKENS, Process, api, environment, fio, publish, remember_token, spread, start_server,
                      wait_archived, wait_port)

NFS_MIX = ROOT / "target" / "release" / "nfs-mix"
WORK = Path("/var/tmp/rewind-bench-sync")
NBD, HTTP, NFS, NBDKIT = 11960, 11961, 11962, 11963
SERVERS = {"spares": [], "no spares": ["--journal-spares", "0"]}
NBD_JOBS = {
    "4 KiB random writes, each synced (QD 1)": ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=1"],
    "4 KiB random writes, a sync every 8 (QD 32)": ["--rw=randwrite", "--bs=4k", "--iodepth=32", "--fsync=8"],
}
MIXES = (96, 60)
SIZE = "256M"


def nfs_mix(mix, seconds, directory):
    output = subprocess.run(
        [str(NFS_MIX), "--nfs-port", str(NFS), "--mount-port", str(NFS), "--export", "/home", "--dir", directory,
         "--updates", str(mix), "--seconds", str(seconds), "--clients", "4"],
        check=True, capture_output=True, text=True, timeout=600,
    ).stdout
    return json.loads(output)["ops"] / seconds


def disk_bytes_written(pid):
    """What the process has had written to the disk (`write_bytes` of /proc/PID/io)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"no write_bytes in /proc/{pid}/io")


def rewind(options, seconds):
    """One fresh server: {job: (operations per second, disk bytes per byte
    the client wrote during the job and until the next)}."""
    _, data, server = start_server(WORK / "rewind", NBD, HTTP, options=["--nfs", f"127.0.0.1:{NFS}", *options])
    http = f"127.0.0.1:{HTTP}"
    remember_token(http, data)
    api(http, "POST", "/v1/volumes", {"name": "home", "size_bytes": 0, "tree": True})
    api(http, "POST", "/v1/volumes", {"name": "vol", "size_bytes": 256 << 20})
    results = {}
    pid = server.process.pid

    def received():
        """Bytes written to the volume and the tree so far (the server's count, fio's ramp included)."""
        request = urllib.request.Request(f"http://{http}/metrics", headers={"Authorization": f"Bearer {TOKENS[http]}"})
        with urllib.request.urlopen(request) as response:
            metrics = response.read().decode()
        counters = re.findall(r'^rewind_volume_write_bytes_total\{volume="(?:vol|home)"\} (\d+)$', metrics, re.M)
        assert len(counters) == 2, metrics
        return sum(int(counter) for counter in counters)

    def measured(job, run):
        disk, client = disk_bytes_written(pid), received()
        results[job] = (run(), (disk_bytes_written(pid) - disk) / (received() - client))

    uri = f"nbd://127.0.0.1:{NBD}/vol"
    jobs = {job: (lambda _, args=args: fio(uri, "sync", args, SIZE, runtime=seconds)["write"]["iops"])
            for job, args in NBD_JOBS.items()}
    jobs.update({f"NFS mix, {mix}% updates": (lambda round, mix=mix: nfs_mix(mix, seconds, f"{round}{mix}"))
                 for mix in MIXES})
    try:
        for job in jobs.values():
            job("unmeasured")
        for volume in ("vol", "home"):
            wait_archived(http, volume)
        spares = sorted(path.name for path in data.glob("volumes/*/journal/spare-*"))
        print(f"spares after the unmeasured jobs: {len(spares)}", flush=True)
        for name, job in jobs.items():
            measured(name, lambda: job("measured"))
    finally:
        server.stop()
    return results


def nbdkit(seconds):
    image = WORK / "nbdkit.img"
    image.unlink(missing_ok=True)
    with open(image, "wb") as file:
        file.truncate(256 << 20)
    server = Process(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(NBDKIT), "file", str(image)])
    wait_port(NBDKIT)
    try:
        return {job: fio(f"nbd://127.0.0.1:{NBDKIT}/", "sync", args, SIZE, runtime=seconds)["write"]["iops"]
                for job, args in NBD_JOBS.items()}
    finally:
        server.stop()
        image.unlink()


def device(seconds):
    path = WORK / "device.img"
    job = fio(str(path), "device", ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=1"], SIZE, runtime=seconds)
    path.unlink()
    return job["write"]["iops"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args()
    env = environment()
    runs = {name: [] for name in [*SERVERS, "nbdkit file"]}
    devices = []
    for run in range(args.runs):
        shutil.rmtree(WORK, ignore_errors=True)
        WORK.mkdir(parents=True)
        devices.append(device(args.seconds))
        order = list(SERVERS) if run % 2 == 0 else list(reversed(SERVERS))
        for name in order:
            runs[name].append(rewind(SERVERS[name], args.seconds))
            print(f"run {run} {name}: {runs[name][-1]}", flush=True)
        runs["nbdkit file"].append(nbdkit(args.seconds))
    shutil.rmtree(WORK, ignore_errors=True)

    jobs = list(runs["spares"][0])
    lines = [
        "<!-- sync:begin (written by bench/sync.py; do not edit by hand) -->",
        "## Commits at the disk's latency: journal spares (issues 13 and 15)",
        "",
        f"`python3 bench/sync.py --runs {args.runs} --seconds {args.seconds}` — {env['date']}, commit {env['commit']},"
        f" {env['cpu']}, {env['memory']}, {env['fio']}, {env['nbdkit']}. Each server fresh per run (new data"
        " directory, volume and tree), alternating order; every job run once unmeasured, and the background work"
        f" let finish, before the measured ones; {args.seconds} s per job. Operations per second, min /"
        " median / max. The disk: fio `--direct=1 --fsync=1` 4 KiB random writes on a file:"
        f" {spread(devices, 0)} synced writes per second.",
        "",
        "| job | Rewind, spares (as shipped) | Rewind, `--journal-spares 0` | spares ÷ none | nbdkit file |"
        " Rewind ÷ nbdkit |",
        "|---|---:|---:|---|---:|---|",
    ]
    for job in jobs:
        spares = [result[job][0] for result in runs["spares"]]
        none = [result[job][0] for result in runs["no spares"]]
        ratio = spread([a / b for a, b in zip(spares, none)])
        if job in NBD_JOBS:
            baseline = [result[job] for result in runs["nbdkit file"]]
            versus = spread([a / b for a, b in zip(spares, baseline)])
            nbdkit_cell = spread(baseline, 0)
        else:
            nbdkit_cell = versus = "–"
        lines.append(f"| {job} | {spread(spares, 0)} | {spread(none, 0)} | {ratio} | {nbdkit_cell} | {versus} |")
    lines += [
        "",
        "What it costs: the server's disk writes (`write_bytes` of /proc/PID/io: the journal, the current store,"
        " the index, the chunk store, and the spares written ahead) per byte written to the volume or tree (the"
        " server's `write_bytes`), over each job (min / median / max). Background work a job leaves falls in the"
        " next job's figure, and the last job's is not counted.",
        "",
        "| job | spares (as shipped) | `--journal-spares 0` |",
        "|---|---|---|",
    ]
    for job in jobs:
        spares = [result[job][1] for result in runs["spares"]]
        none = [result[job][1] for result in runs["no spares"]]
        lines.append(f"| {job} | {spread(spares)} | {spread(none)} |")
    lines.append("<!-- sync:end -->")
    publish("sync", lines)


if __name__ == "__main__":
    main()
