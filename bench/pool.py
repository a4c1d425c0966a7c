#!/usr/bin/env python3
"""Two nodes, one bucket (issue 14 req 7; req 11's requests and bytes per
GiB uploaded): what sharing a bucket saves, and what it costs.

Two machines cloned from one image, each then writing data of its own: per
run, two pairs of Rewind servers on one MinIO, each node a --size volume
written with the same image of random bytes (nbdcopy from one file),
bookmarked `base`, then a quarter of the volume written over with bytes of
its own (fio, a seed per node). One pair keeps a prefix per node (the
baseline: what two nodes store today); the other shares one prefix with
`--node-name` (the second node borrows the image from the first's packs).
Each pair writes, archives, uploads and publishes its catalogs, one pair
after the other (alternating which goes first), with MinIO's own request
counters read around each pair. Then, with every pack evicted
(`--cache-max 0`), `rewind restore v@base` on the second node of each pair,
in alternating order, the page cache dropped before each: history borrowed
from the other node's packs against history in the node's own.

Reports, min / median / max over the runs: the bytes both nodes keep in the
bucket (shared ÷ separate), S3 requests and GiB received by MinIO per GiB of
history written (the uploads: packs, parts, catalogs and pieces, and the
listings and reads of the others' catalogs), and the restore speed of
borrowed ÷ own history.

Usage: python3 bench/pool.py [--runs 3] [--size 512M]
"""

import argparse
import filecmp
import os
import shutil
import subprocess
import time
from pathlib import Path

from benchlib import (
    REWIND,
    api,
    drop_caches,
    environment,
    fio,
    minio_requests,
    minio_since,
    publish,
    remember_token,
    size_of,
    spread,
    start_minio,
    start_server,
    tear_down,
    timed,
    wait_archived,
    wait_port,
)

MINIO_PORT = 10960
# NBD and HTTP ports of the four nodes.
PORTS = {"c": (10961, 10962), "d": (10963, 10964), "a": (10965, 10966), "b": (10967, 10968)}
PAIRS = {"separate": ("c", "d"), "shared": ("a", "b")}
# Catalogs every 2 s, so a run does not wait minutes for them.
INTERVALS = ["--archive-interval", "1s", "--upload-interval", "2s", "--cache-max", "0"]
PUT_APIS = ("putobject", "putobjectpart", "completemultipartupload", "newmultipartupload")


def wait_until(what, condition, timeout_seconds=900):
    deadline = time.monotonic() + timeout_seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)
    return value


def bucket_of(http):
    return api(http, "GET", "/v1/stats")["bucket"]


def settled(http, since_nanos):
    """Every pack uploaded and evicted, and a catalog covering the volume
    up to `since_nanos` published: the node's history is all in the bucket."""
    bucket = bucket_of(http)
    catalog = bucket.get("catalog") or {}
    covered = any(volume["recoverable_to_unix_nanos"] > since_nanos for volume in catalog.get("volumes", []))
    return bucket if covered and bucket["upload_waiting_packs"] == 0 and bucket["local_packs"] <= 4 else None


def write_node(node, http, image, size):
    nbd = PORTS[node][0]
    api(http, "POST", "/v1/volumes", {"name": "v", "size_bytes": size})
    subprocess.run(["nbdcopy", str(image), f"nbd://127.0.0.1:{nbd}/v"], check=True)
    api(http, "POST", "/v1/volumes/v/bookmarks", {"name": "base"})
    own = ["--rw=write", "--bs=1m", "--iodepth=4", "--refill_buffers", "--end_fsync=1"]
    fio(f"nbd://127.0.0.1:{nbd}/v", f"own-{node}", own, str(size // 4), extra=[f"--randseed={ord(node)}"])
    wait_archived(http, "v")
    written = time.time_ns()
    return wait_until(f"node {node}'s history in the bucket", lambda: settled(http, written))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="512M")
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-pool")
    args = parser.parse_args()
    size = size_of(args.size)
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    minio = start_minio(work / "minio", MINIO_PORT, ["rewind"])
    endpoint = f"http://127.0.0.1:{MINIO_PORT}"
    image = work / "image.raw"
    image.write_bytes(os.urandom(size))
    history_gib = 2 * (size + size // 4) / (1 << 30)
    stored = {pair: [] for pair in PAIRS}
    requests = {pair: [] for pair in PAIRS}
    puts = {pair: [] for pair in PAIRS}
    received = {pair: [] for pair in PAIRS}
    restore_mib_s = {pair: [] for pair in PAIRS}
    borrowed = []
    servers = []
    try:
        for run in range(args.runs):
            https = {}
            for pair in PAIRS if run % 2 == 0 else reversed(PAIRS):
                before = minio_requests(MINIO_PORT)
                kept = 0
                for node in PAIRS[pair]:
                    prefix = f"s3://rewind/run-{run}-{pair}" + ("" if pair == "shared" else f"-{node}")
                    options = ["--bucket", prefix, "--endpoint", endpoint, *INTERVALS]
                    if pair == "shared":
                        options += ["--node-name", node, "--pool-grace", "1m"]
                    _, data, server = start_server(work / f"run-{run}-{node}", *PORTS[node], options)
                    servers.append(server)
                    wait_port(PORTS[node][0])
                    https[node] = f"127.0.0.1:{PORTS[node][1]}"
                    remember_token(https[node], data)
                    if pair == "shared" and node == "b":
                        chunks = size // 4096
                        wait_until("b to read a's chunk table",
                                   lambda: (bucket_of(https["b"]).get("catalog") or {}).get("pool", {})
                                   .get("chunks_lendable", 0) >= chunks)
                    bucket = write_node(node, https[node], image, size)
                    kept += bucket["bucket_bytes"]
                    if pair == "shared" and node == "b":
                        borrowed.append(bucket["catalog"]["pool"]["chunks_borrowed"] * 4096 / size)
                served = minio_since(before, minio_requests(MINIO_PORT))
                stored[pair].append(kept)
                requests[pair].append(sum(served["requests"].values()) / history_gib)
                puts[pair].append(sum(served["requests"].get(name, 0) for name in PUT_APIS) / history_gib)
                received[pair].append(served["received"] / history_gib / (1 << 30))
                print(f"run {run} {pair}: {kept / (1 << 20):.0f} MiB in the bucket, {served}", flush=True)
            for pair in PAIRS if run % 2 == 1 else reversed(PAIRS):
                node = PAIRS[pair][1]
                restored = work / "restored.raw"
                restored.unlink(missing_ok=True)
                drop_caches()
                rewind = [str(REWIND), "--server", f"http://{https[node]}", "--data-dir", str(work / f"run-{run}-{node}" / "data")]
                elapsed, _ = timed([*rewind, "restore", "v@base", "--to", str(restored)])
                if not filecmp.cmp(restored, image, shallow=False):
                    raise RuntimeError(f"the restore of {node}'s v@base is not the image")
                restore_mib_s[pair].append(size / (1 << 20) / elapsed)
                print(f"run {run} restore on {node} ({pair}): {elapsed:.2f} s", flush=True)
            for server in servers:
                server.stop()
            servers.clear()
    finally:
        tear_down(servers, minio, work)
    env = environment()
    ratio = [shared / separate for shared, separate in zip(stored["shared"], stored["separate"])]
    restore_ratio = [shared / own for shared, own in zip(restore_mib_s["shared"], restore_mib_s["separate"])]
    mib = lambda values: [value / (1 << 20) for value in values]  # noqa: E731
    lines = [
        "<!-- pool:begin (written by bench/pool.py; do not edit by hand) -->",
        "## Two nodes, one bucket (issue 14)",
        "",
        f"`python3 bench/pool.py --runs {args.runs} --size {args.size}` — {env['date']}, commit {env['commit']}, "
        f"{env['cpu']}, {env['memory']}, MinIO on 127.0.0.1 (same disk). Per run, two pairs of nodes on one "
        f"MinIO, each node a {args.size}iB volume written with the same image of random bytes, bookmarked, then a "
        "quarter written over with bytes of its own: one pair with a prefix per node, one sharing a prefix "
        "(`--node-name`). Requests and bytes as MinIO counted them while each pair wrote, archived, uploaded "
        f"and published, per GiB of history written ({history_gib:.2f} GiB per pair). Then `rewind restore "
        "v@base` on each pair's second node from the bucket alone (`--cache-max 0`), the page cache dropped "
        "before each. Min / median / max.",
        "",
        "| two nodes | MiB in the bucket | ÷ separate | S3 requests per GiB | of them PUTs per GiB | GiB received "
        "per GiB | restore of `v@base` MiB/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pair in PAIRS:
        share = spread(ratio) if pair == "shared" else "1.00"
        lines.append(
            f"| {pair} | {spread(mib(stored[pair]), 0)} | {share} | {spread(requests[pair], 0)} | "
            f"{spread(puts[pair], 0)} | {spread(received[pair])} | {spread(restore_mib_s[pair], 0)} |"
        )
    lines += [
        "",
        f"The second node of the shared pair borrowed {spread(borrowed)} of its image from the first's packs; "
        f"its restore of that borrowed history ran at {spread(restore_ratio)}× the speed of the separate "
        "node's restore of its own.",
        "<!-- pool:end -->",
    ]
    publish("pool", lines)


if __name__ == "__main__":
    main()
