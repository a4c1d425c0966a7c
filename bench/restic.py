#!/usr/bin/env python3
"""Restore from a bucket against restic, and writes with tiering on and off
(issue 14 req 11), on one MinIO in the same run.

The image: --size of random bytes (neither compresses nor deduplicates),
on the same filesystem.

- restic (Debian's, the tool a user would pick instead): `restic backup`
  of the image into a repository in MinIO, then per run `restic restore
  latest` of it.
- Rewind: `rewind serve --bucket … --key-file … --cache-max 0` (encrypted,
  as restic's repository is), a volume the image is copied into with
  nbdcopy and bookmarked `point`, then written over once with other bytes
  (so the point is history, not the present) and archived; every pack is
  uploaded and all but the newest four evicted from the disk. Per run,
  `rewind restore v@point --to FILE` (through the server's API), which reads
  the point's history from MinIO.

Both restores end with their data synced; the page cache is dropped before
each. Each restored file is compared with the image once. Then fio writes
(`--rw=write --bs=1m --iodepth=4`, --write-size to a new volume per run,
with a final fsync) to a server with the bucket and key and one without, in
alternating order, --write-runs times: tiering on ÷ off (both archiving
every second). Before each write both servers are brought to rest — every
volume archived, every pack uploaded, `sync` — so that no write pays for
the previous one's archiving and uploads on these two shared cores (MinIO
is on the same machine), only for what tiering does during it.

Usage: python3 bench/restic.py [--runs 3] [--size 2G] [--write-size 1G] [--write-runs 5]
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
TIERED = (10961, 10962)
PLAIN = (10963, 10964)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="2G")
    parser.add_argument("--write-size", default="1G")
    parser.add_argument("--write-runs", type=int, default=5)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-restic")
    args = parser.parse_args()
    if shutil.which("restic") is None:
        raise SystemExit("bench/restic.py compares against restic: apt-get install restic (Debian 12 has 0.14)")
    size = size_of(args.size)
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    minio = start_minio(work / "minio", MINIO_PORT, ["rewind", "restic"])
    endpoint = f"http://127.0.0.1:{MINIO_PORT}"
    image = work / "image.raw"
    subprocess.run(["head", "-c", str(size), "/dev/urandom"], stdout=image.open("wb"), check=True)
    key = work / "key"
    key.write_bytes(os.urandom(32))
    restic_env = {**os.environ, "RESTIC_PASSWORD": "rewind-bench", "RESTIC_REPOSITORY": f"s3:{endpoint}/restic/repo"}
    seconds = {"rewind": [], "restic": []}
    write_mib_s = {"on": [], "off": []}
    servers = []
    try:
        subprocess.run(["restic", "init"], env=restic_env, check=True, capture_output=True)
        backup_seconds, _ = timed(["restic", "backup", "--quiet", str(image)], env=restic_env)
        print(f"restic backup: {backup_seconds:.1f} s", flush=True)

        options = ["--bucket", "s3://rewind/bench", "--endpoint", endpoint, "--key-file", str(key), "--cache-max", "0",
                   "--archive-interval", "1s"]
        _, data, server = start_server(work / "tiered", *TIERED, options)
        servers.append(server)
        nbd, http = TIERED[0], f"127.0.0.1:{TIERED[1]}"
        wait_port(nbd)
        remember_token(http, data)
        api(http, "POST", "/v1/volumes", {"name": "v", "size_bytes": size})
        subprocess.run(["nbdcopy", str(image), f"nbd://127.0.0.1:{nbd}/v"], check=True)
        api(http, "POST", "/v1/volumes/v/bookmarks", {"name": "point"})
        wait_archived(http, "v")
        fio(f"nbd://127.0.0.1:{nbd}/v", "over", ["--rw=write", "--bs=1m", "--iodepth=4", "--refill_buffers"],
            args.size, extra=["--randseed=2"])
        wait_archived(http, "v")
        deadline = time.monotonic() + 900
        while (stats := api(http, "GET", "/v1/stats")["bucket"])["upload_waiting_packs"] > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the uploads did not finish: {stats}")
            time.sleep(0.5)
        print(f"bucket: {stats}", flush=True)
        rewind = [str(REWIND), "--server", f"http://{http}", "--data-dir", str(data)]

        for run in range(args.runs):
            order = ["rewind", "restic"] if run % 2 == 0 else ["restic", "rewind"]
            for tool in order:
                target = work / f"restored-{tool}"
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir()
                drop_caches()
                if tool == "rewind":
                    restored = target / "image.raw"
                    elapsed, _ = timed([*rewind, "restore", "v@point", "--to", str(restored)])
                else:
                    # Made durable too, as `rewind restore` makes its target.
                    restored = target / str(image).lstrip("/")
                    start = time.monotonic()
                    subprocess.run(["restic", "restore", "latest", "--target", str(target)], env=restic_env,
                                   check=True, capture_output=True)
                    subprocess.run(["sync", str(restored)], check=True)
                    elapsed = time.monotonic() - start
                seconds[tool].append(elapsed)
                print(f"run {run} {tool:6}: {elapsed:6.2f} s", flush=True)
                if run == 0 and not filecmp.cmp(restored, image, shallow=False):
                    raise RuntimeError(f"{tool}'s restore differs from the image")
                shutil.rmtree(target)

        # The same server but for the bucket: archiving every second too.
        _, plain_data, plain = start_server(work / "plain", *PLAIN, ["--archive-interval", "1s"])
        servers.append(plain)
        wait_port(PLAIN[0])
        remember_token(f"127.0.0.1:{PLAIN[1]}", plain_data)
        write = ["--rw=write", "--bs=1m", "--iodepth=4", "--refill_buffers", "--end_fsync=1"]
        written = {"on": [], "off": []}

        def rest():
            subprocess.run(["sync"], check=True)
            for mode, (_, http_port) in (("on", TIERED), ("off", PLAIN)):
                for volume in written[mode]:
                    wait_archived(f"127.0.0.1:{http_port}", volume)
            deadline = time.monotonic() + 900
            while api(http, "GET", "/v1/stats")["bucket"]["upload_waiting_packs"] > 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("the uploads did not finish")
                time.sleep(0.2)

        for run in range(args.write_runs):
            order = [("on", TIERED), ("off", PLAIN)]
            for mode, (nbd, http_port) in order if run % 2 == 0 else reversed(order):
                name = f"w{run}"
                rest()
                written[mode].append(name)
                api(f"127.0.0.1:{http_port}", "POST", "/v1/volumes", {"name": name, "size_bytes": size_of(args.write_size)})
                job = fio(f"nbd://127.0.0.1:{nbd}/{name}", name, write, args.write_size)
                write_mib_s[mode].append(job["write"]["bw_bytes"] / (1 << 20))
                print(f"run {run} tiering {mode:3}: {write_mib_s[mode][-1]:6.0f} MiB/s", flush=True)
    finally:
        tear_down(servers, minio, work)

    mib_s = {tool: [size / (1 << 20) / s for s in values] for tool, values in seconds.items()}
    speedup = [restic / rewind for rewind, restic in zip(seconds["rewind"], seconds["restic"])]
    tiering = [on / off for on, off in zip(write_mib_s["on"], write_mib_s["off"])]
    env = environment()
    restic_version = subprocess.run(["restic", "version"], capture_output=True, text=True).stdout.split(" compiled")[0]
    lines = [
        "<!-- restic:begin (written by bench/restic.py; do not edit by hand) -->",
        "## Restore from a bucket: Rewind and restic (issue 14)",
        "",
        f"`python3 bench/restic.py --runs {args.runs} --size {args.size} --write-size {args.write_size} "
        f"--write-runs {args.write_runs}` — "
        f"{env['date']}, commit {env['commit']}, {env['cpu']}, {env['memory']}, {restic_version}, MinIO on "
        f"127.0.0.1 (same disk). The same {args.size}iB image of random bytes restored from the same MinIO: by "
        "`restic restore latest` after `restic backup` of the image, and by `rewind restore v@point` of a "
        "bookmark whose history was uploaded and evicted (`--cache-max 0`, encrypted with `--key-file` as "
        "restic's repository is). Page cache dropped before each restore; alternating order; each restore "
        "compared with the image once. Seconds and MiB/s (min / median / max).",
        "",
        "| restore from MinIO | seconds | MiB/s | speed ÷ restic |",
        "|---|---:|---:|---:|",
        f"| restic restore | {spread(seconds['restic'])} | {spread(mib_s['restic'], 0)} | 1.00 |",
        f"| rewind restore | {spread(seconds['rewind'])} | {spread(mib_s['rewind'], 0)} | {spread(speedup)} |",
        "",
        f"`restic backup` of the image took {backup_seconds:.1f} s (once). Writes with tiering on (the bucket, "
        f"the key, uploads and evictions running) ÷ off, fio `--rw=write --bs=1m --iodepth=4` of "
        f"{args.write_size}iB to a new volume with a final fsync, {args.write_runs} runs, both servers brought to "
        f"rest (archived, uploaded, synced) before each: on {spread(write_mib_s['on'], 0)} MiB/s, off "
        f"{spread(write_mib_s['off'], 0)} MiB/s, ratio {spread(tiering)}.",
        "<!-- restic:end -->",
    ]
    publish("restic", lines)


if __name__ == "__main__":
    main()
