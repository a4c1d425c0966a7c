#!/usr/bin/env python3
"""History read back from a bucket (issue 14 req 2): a view of history whose
packs were evicted to a real MinIO, read sequentially over NBD, against the
same view on a server that keeps every pack on its disk, in the same run.

Per server: a new volume of --size written once with 1 MiB writes of bytes
that neither deduplicate nor compress (fio --refill_buffers), bookmarked,
archived, then written over once (so the bookmark's blocks are history,
not the present) and archived again. The bucket server (`--bucket`, `--cache-max 0`)
uploads every pack and evicts all but its newest four from its disk (those
hold the overwrite). Then, in alternating order, fio reads the view
`v@before` (`--rw=read --bs=1m`) from each. MiB/s, bucket ÷ local, and the
requests and bytes read from the bucket per GiB read.

Then the bucket server stops (cleanly: its last catalog is published) and
the node is recovered from MinIO alone onto an empty data directory, --runs
times (`rewind node recover`): the RTO, and its MiB/s of volume rebuilt
beside the view's.

Usage: python3 bench/bucket.py [--runs 3] [--size 512M]
"""

import argparse
import json
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from benchlib import (
    REWIND,
    api,
    environment,
    fio,
    publish,
    remember_token,
    spread,
    start_minio,
    start_server,
    tear_down,
    wait_archived,
    wait_port,
)

MINIO_PORT = 10990
SERVERS = {"local": (10991, 10992), "bucket": (10993, 10994)}


def bucket_stats(http):
    return api(http, "GET", "/v1/stats")["bucket"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="512M")
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-bucket")
    args = parser.parse_args()
    size_bytes = int(args.size[:-1]) << {"M": 20, "G": 30}[args.size[-1]]
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    minio = start_minio(work / "minio", MINIO_PORT, ["rewind"])
    options = {
        "local": [],
        "bucket": ["--bucket", "s3://rewind/bench", "--endpoint", f"http://127.0.0.1:{MINIO_PORT}", "--cache-max", "0"],
    }
    servers, https = [], {}
    mib_s = {name: [] for name in SERVERS}
    try:
        for name, (nbd, http) in SERVERS.items():
            _, data, server = start_server(work / name, nbd, http, options[name])
            servers.append(server)
            wait_port(nbd)
            https[name] = f"127.0.0.1:{http}"
            remember_token(https[name], data)
        write = ["--rw=write", "--bs=1m", "--iodepth=4", "--refill_buffers", "--end_fsync=1"]
        for name, (nbd, _) in SERVERS.items():
            http = https[name]
            api(http, "POST", "/v1/volumes", {"name": "v", "size_bytes": size_bytes})
            fio(f"nbd://127.0.0.1:{nbd}/v", "before", write, args.size)
            api(http, "POST", "/v1/volumes/v/bookmarks", {"name": "before"})
            # Archived before it is written over, as older history is.
            wait_archived(http, "v")
            fio(f"nbd://127.0.0.1:{nbd}/v", "after", write, args.size, extra=["--randseed=2"])
            wait_archived(http, "v")
        deadline = time.monotonic() + 600
        while (stats := bucket_stats(https["bucket"]))["upload_waiting_packs"] > 0 or stats["evictions"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the uploads did not finish: {stats}")
            time.sleep(0.5)
        before = bucket_stats(https["bucket"])
        print(f"bucket before the reads: {before}", flush=True)
        read = ["--rw=read", "--bs=1m", "--iodepth=4"]
        for run in range(args.runs):
            order = list(SERVERS) if run % 2 == 0 else list(reversed(SERVERS))
            for name in order:
                nbd = SERVERS[name][0]
                job = fio(f"nbd://127.0.0.1:{nbd}/v@before", "view", read, args.size)
                mib_s[name].append(job["read"]["bw_bytes"] / (1 << 20))
                print(f"run {run} {name:6}: {mib_s[name][-1]:6.0f} MiB/s", flush=True)
        after = bucket_stats(https["bucket"])
        # The lost node: rebuilt from the bucket alone.
        servers.pop().stop()
        recover_seconds = []
        for run in range(args.runs):
            target = work / f"recovered-{run}"
            command = [str(REWIND), "--data-dir", str(target), "node", "recover", "--bucket", "s3://rewind/bench",
                       "--endpoint", f"http://127.0.0.1:{MINIO_PORT}", "--json"]
            summary = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            assert [volume["name"] for volume in summary["volumes"]] == ["v"], summary
            recover_seconds.append(summary["seconds"])
            print(f"run {run} recover: {recover_seconds[-1]:.2f} s", flush=True)
            shutil.rmtree(target)
    finally:
        tear_down(servers, minio, work)
    gib_read = args.runs * size_bytes / (1 << 30)
    requests = (after["bucket_reads"] - before["bucket_reads"]) / gib_read
    bytes_read = (after["bucket_read_bytes"] - before["bucket_read_bytes"]) / gib_read / (1 << 30)
    ratios = [bucket / local for bucket, local in zip(mib_s["bucket"], mib_s["local"])]
    recover_mib_s = [size_bytes / (1 << 20) / seconds for seconds in recover_seconds]
    env = environment()
    lines = [
        "<!-- bucket:begin (written by bench/bucket.py; do not edit by hand) -->",
        "## History read back from a bucket (issue 14)",
        "",
        f"`python3 bench/bucket.py --runs {args.runs} --size {args.size}` — {env['date']}, commit {env['commit']}, "
        f"{env['cpu']}, {env['memory']}, {env['fio']}, MinIO on 127.0.0.1 (same disk). A view of history "
        f"({args.size}iB written, bookmarked and archived, then written over and archived) read sequentially over NBD "
        "(`fio --rw=read --bs=1m --iodepth=4`), from a server whose packs were uploaded to MinIO and evicted "
        "(`--cache-max 0`) and from one that keeps them on its disk; alternating order. MiB/s (min / median / max).",
        "",
        "| view of evicted history | MiB/s | ÷ local |",
        "|---|---:|---:|",
        f"| packs on the local disk | {spread(mib_s['local'], 0)} | 1.00 |",
        f"| packs in MinIO, ranged GETs | {spread(mib_s['bucket'], 0)} | {spread(ratios)} |",
        "",
        f"Per GiB read from the bucket: {requests:.0f} GET requests, {bytes_read:.2f} GiB transferred; "
        f"{before['bucket_packs']} packs in the bucket, {before['local_packs']} kept on the disk.",
        "",
        f"Recovering the node from MinIO alone (`rewind node recover` onto an empty data directory: the catalog, "
        f"the packs' footers, and the {args.size}iB volume's present rebuilt from history), {args.runs} times: "
        f"{spread(recover_seconds)} s, {spread(recover_mib_s, 0)} MiB/s of volume rebuilt "
        f"({statistics.median(recover_mib_s) / statistics.median(mib_s['bucket']):.2f}× the median MiB/s of the "
        "view of evicted history above).",
        "<!-- bucket:end -->",
    ]
    publish("bucket", lines)


if __name__ == "__main__":
    main()
