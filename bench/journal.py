#!/usr/bin/env python3
"""The journal at the device's limit (issue 13, req 1): one pass of 1 MiB
sequential writes into a new 1 GiB volume with a final flush, over NBD, beside
what the disk itself takes, all on the same filesystem in one run.

Per run, in rotating order:
- the device: fio on a file, `--direct=1 --bs=4m`, with `--fdatasync=1` (every
  byte kept once and synced as it goes: the physical limit for every-write
  history) and without syncs;
- Rewind (every-write history, the journaled layout, archiving as usual),
  with its journal written with direct I/O (as shipped) and through the
  page cache (`--journal-io buffered`, the alternative);
- Rewind as shipped, on a volume with a granularity of one minute (history
  keeps one version per block per minute: what the window supersedes is
  dropped before it is archived; the journal still takes every write);
- `nbdkit file` (the tool a user would pick instead) on a file.
The NBD jobs are fio `--rw=write --bs=1m --iodepth=4 --end_fsync=1`. Each
Rewind volume is deleted after its run (and the server's background work
waits to be quiet before the next). MiB/s, and each ÷ the device with syncs.

Usage: python3 bench/journal.py [--runs 5] [--size 1G]
"""

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from benchlib import Process, api, environment, fio, remember_token, spread, start_server, wait_archived, wait_port, write_section

# Rewind as it ships (journal with direct I/O) and with the alternative it replaced.
SERVERS = {
    "rewind": (10981, 10982, []),
    "rewind, buffered journal": (10983, 10984, ["--journal-io", "buffered"]),
    "rewind, no burst quiet": (10986, 10987, ["--burst-quiet", "0s"]),
}
NBDKIT = 10985
# Jobs on a server above, with the volume created with these settings.
VOLUMES = {"rewind, granularity 1m": ("rewind", {"granularity": "1m"})}
NBD_JOB = ["--rw=write", "--bs=1m", "--iodepth=4", "--end_fsync=1"]


def device(work, name, sync, size):
    target = work / "device.img"
    target.unlink(missing_ok=True)
    command = [
        "fio", "--output-format=json", f"--name={name}", f"--filename={target}", "--rw=write", "--bs=4m",
        f"--size={size}", "--ioengine=psync", "--direct=1", *(["--fdatasync=1"] if sync else []),
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result = json.loads(output[output.index("{"):])["jobs"][0]["write"]["bw_bytes"]
    target.unlink()
    return result / (1 << 20)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-journal")
    args = parser.parse_args()
    size_bytes = int(args.size[:-1]) << {"M": 20, "G": 30}[args.size[-1]]
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    servers, https, data = [], {}, {}
    for name, (nbd, http, options) in SERVERS.items():
        _, data[name], server = start_server(work / name, nbd, http, options)
        servers.append(server)
    mib_s = {name: [] for name in ["device, fdatasync", "device, no syncs", *SERVERS, *VOLUMES, "nbdkit file"]}
    try:
        for name, (nbd, http, _) in SERVERS.items():
            wait_port(nbd)
            https[name] = f"127.0.0.1:{http}"
            remember_token(https[name], data[name])
        for run in range(args.runs):
            jobs = list(mib_s)
            jobs = jobs[run % len(jobs):] + jobs[:run % len(jobs)]
            for job in jobs:
                if job.startswith("device"):
                    mib_s[job].append(device(work, "device", job == "device, fdatasync", args.size))
                elif job == "nbdkit file":
                    image = work / "nbdkit.img"
                    with open(image, "wb") as f:
                        f.truncate(size_bytes)
                    nbdkit = Process(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(NBDKIT), "file", str(image)])
                    try:
                        wait_port(NBDKIT)
                        result = fio(f"nbd://127.0.0.1:{NBDKIT}/", "nbdkit", NBD_JOB, args.size)
                    finally:
                        nbdkit.stop()
                        image.unlink()
                    mib_s[job].append(result["write"]["bw_bytes"] / (1 << 20))
                else:
                    server, settings = VOLUMES.get(job, (job, {}))
                    nbd, http = SERVERS[server][0], https[server]
                    volume = f"run{run}"
                    api(http, "POST", "/v1/volumes", {"name": volume, "size_bytes": size_bytes, **settings})
                    result = fio(f"nbd://127.0.0.1:{nbd}/{volume}", job, NBD_JOB, args.size)
                    mib_s[job].append(result["write"]["bw_bytes"] / (1 << 20))
                    wait_archived(http, volume)
                    api(http, "DELETE", f"/v1/volumes/{volume}")
                print(f"run {run} {job:26}: {mib_s[job][-1]:6.0f} MiB/s", flush=True)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(args.dir, ignore_errors=True)
    env = environment()
    limit = mib_s["device, fdatasync"]
    rows = {
        "device, fdatasync": "the disk: fio `--direct=1 --bs=4m --fdatasync=1` on a file",
        "device, no syncs": "the disk: fio `--direct=1 --bs=4m`, no syncs",
        "rewind": "Rewind, over NBD (journal with direct I/O, as shipped)",
        "rewind, granularity 1m": "Rewind as shipped, a volume with `--granularity 1m`",
        "rewind, buffered journal": "Rewind, over NBD, `--journal-io buffered` (through the page cache)",
        "rewind, no burst quiet": "Rewind, over NBD, `--burst-quiet 0s` (destaging and archiving alongside the burst)",
        "nbdkit file": "`nbdkit file` on a file",
    }
    lines = [
        "<!-- journal:begin (written by bench/journal.py; do not edit by hand) -->",
        "## The journal at the device's limit (issue 13)",
        "",
        f"`python3 bench/journal.py --runs {args.runs} --size {args.size}` — {env['date']}, commit {env['commit']}, "
        f"{env['cpu']}, {env['memory']}, {env['fio']}, {env['nbdkit']}. One pass of 1 MiB sequential writes into a "
        f"new {args.size}iB volume, fio over NBD (`{' '.join(NBD_JOB)}`), beside the disk measured by fio in the same "
        "run on the same filesystem; runs in rotating order. MiB/s and ÷ the disk with syncs (min / median / max).",
        "",
        "| writer | MiB/s | ÷ the disk with fdatasync |",
        "|---|---:|---:|",
    ]
    for job, label in rows.items():
        ratios = [value / base for value, base in zip(mib_s[job], limit)]
        lines.append(f"| {label} | {spread(mib_s[job], 0)} | {spread(ratios)} |")
    lines.append("<!-- journal:end -->")
    section = "\n".join(lines)
    print(section)
    write_section("journal", section)


if __name__ == "__main__":
    main()
