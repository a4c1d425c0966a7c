#!/usr/bin/env python3
"""Restore time by the age of the point restored (issue 14 reqs 8 and 11):
`rewind restore` of points ever further back in a volume's history, all of
it evicted to a real MinIO, should take the same time however old the point.

Rewind has no clock to fake, and what a restore's cost could grow with is
not the wall-clock age of a point but how much was written after it (the
index versions it looks past, the packs it reads around). So age here is
depth: a volume of --size is written over wholly --rounds times (1 MiB
writes of bytes that neither deduplicate nor compress), each round
bookmarked `rN` and archived; every pack is uploaded and evicted
(`--cache-max 0`). Then, in rotating order, `rewind restore v@rN --to FILE`
(through the server's API; the page cache dropped before each) of the
newest round but one, a middle one, and the first: the older the point, the
more rounds of history were written after it. Seconds (min / median / max)
and each point's median ÷ the newest one's. The present (the last round) is
not restored: it is read from the local current store, not the bucket.

Usage: python3 bench/age.py [--runs 3] [--size 256M] [--rounds 8]
"""

import argparse
import filecmp
import shutil
import statistics
import time
from pathlib import Path

from benchlib import (
    REWIND,
    api,
    drop_caches,
    environment,
    fio,
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

MINIO_PORT = 10950
SERVER = (10951, 10952)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="256M")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-age")
    args = parser.parse_args()
    if args.rounds < 3:
        raise SystemExit("--rounds: at least 3 (a newest, a middle and a first point before the present)")
    size = size_of(args.size)
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    minio = start_minio(work / "minio", MINIO_PORT, ["rewind"])
    endpoint = f"http://127.0.0.1:{MINIO_PORT}"
    # Rounds written after each point restored: newest but one, middle, first.
    points = sorted({args.rounds - 2, (args.rounds - 2) // 2, 0}, reverse=True)
    seconds = {point: [] for point in points}
    servers = []
    try:
        options = ["--bucket", "s3://rewind/age", "--endpoint", endpoint, "--cache-max", "0", "--archive-interval", "1s"]
        _, data, server = start_server(work / "node", *SERVER, options)
        servers.append(server)
        nbd, http = SERVER[0], f"127.0.0.1:{SERVER[1]}"
        wait_port(nbd)
        remember_token(http, data)
        api(http, "POST", "/v1/volumes", {"name": "v", "size_bytes": size})
        write = ["--rw=write", "--bs=1m", "--iodepth=4", "--refill_buffers", "--end_fsync=1"]
        for round_ in range(args.rounds):
            fio(f"nbd://127.0.0.1:{nbd}/v", f"round-{round_}", write, args.size, extra=[f"--randseed={round_ + 1}"])
            api(http, "POST", "/v1/volumes/v/bookmarks", {"name": f"r{round_}"})
            wait_archived(http, "v")
            print(f"round {round_} written and archived", flush=True)
        # Uploaded, and evicted but for the newest four packs (never evicted:
        # they hold the present's history).
        deadline = time.monotonic() + 900
        while (stats := api(http, "GET", "/v1/stats")["bucket"])["upload_waiting_packs"] > 0 or stats["local_packs"] > 4:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the uploads did not finish: {stats}")
            time.sleep(0.5)
        print(f"bucket: {stats}", flush=True)
        rewind = [str(REWIND), "--server", f"http://{http}", "--data-dir", str(data)]
        restored = work / "restored.raw"
        reference = work / "reference.raw"
        for run in range(args.runs):
            # Rotating order: no point always first after a cold cache.
            order = points[run % len(points):] + points[:run % len(points)]
            for point in order:
                restored.unlink(missing_ok=True)
                drop_caches()
                elapsed, _ = timed([*rewind, "restore", f"v@r{point}", "--to", str(restored)])
                seconds[point].append(elapsed)
                print(f"run {run} r{point} ({args.rounds - 1 - point} rounds after it): {elapsed:.2f} s", flush=True)
                if run == 0:
                    # Each point read once more over NBD: the restore is that view.
                    reference.unlink(missing_ok=True)
                    timed(["nbdcopy", f"nbd://127.0.0.1:{nbd}/v@r{point}", str(reference)])
                    if not filecmp.cmp(restored, reference, shallow=False):
                        raise RuntimeError(f"the restore of r{point} differs from the view")
        final = api(http, "GET", "/v1/stats")["bucket"]
    finally:
        tear_down(servers, minio, work)
    newest = statistics.median(seconds[points[0]])
    env = environment()
    lines = [
        "<!-- age:begin (written by bench/age.py; do not edit by hand) -->",
        "## Restore time by the age of the point (issue 14)",
        "",
        f"`python3 bench/age.py --runs {args.runs} --size {args.size} --rounds {args.rounds}` — {env['date']}, "
        f"commit {env['commit']}, {env['cpu']}, {env['memory']}, {env['fio']}, MinIO on 127.0.0.1 (same disk). "
        f"A {args.size}iB volume written over wholly {args.rounds} times (bytes that neither deduplicate nor "
        "compress), each round bookmarked and archived, every pack uploaded to MinIO and evicted "
        f"(`--cache-max 0`: {stats['bucket_packs']} packs, {stats['bucket_bytes'] / (1 << 30):.1f} GiB in the "
        "bucket); then `rewind restore v@rN --to FILE` of points ever older, the page cache dropped before each, "
        "in rotating order. Age is depth: how many whole rounds were written after the point (Rewind has no clock "
        "to fake, and a restore's work depends on what was written after a point, not on its wall-clock age).",
        "",
        "| point restored | rounds written after it | seconds | MiB/s | median ÷ the newest point's |",
        "|---|---:|---:|---:|---:|",
    ]
    for point in points:
        mib_s = [size / (1 << 20) / elapsed for elapsed in seconds[point]]
        lines.append(
            f"| `v@r{point}` | {args.rounds - 1 - point} | {spread(seconds[point])} | {spread(mib_s, 0)} | "
            f"{statistics.median(seconds[point]) / newest:.2f} |"
        )
    lines += [
        "",
        f"Bucket reads over the whole run: {final['bucket_reads']} GETs, "
        f"{final['bucket_read_bytes'] / (1 << 30):.2f} GiB.",
        "<!-- age:end -->",
    ]
    publish("age", lines)


if __name__ == "__main__":
    main()
