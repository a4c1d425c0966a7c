#!/usr/bin/env python3
"""Space benchmark of the chunk store, through real clients over NBD.

1. fio writes a volume with `dedupe_percentage` and `buffer_compress_percentage`
   set, so the data has known deduplication and compression ratios; the
   ratios Rewind achieves on the archived history are set beside them.
2. An operating system image: a Debian root filesystem (debootstrap
   minbase) copied twice into an ext4 filesystem on a volume (nbdfuse +
   loop device), as two installs of the same system would write it; the
   bytes Rewind stores per byte written, for each copy.

Writes its tables into BENCHMARKS.md between the `space` markers. Not a test.

    python3 bench/space.py --rootfs /work/bench-data/rootfs

(`debootstrap --variant=minbase bookworm DIR http://deb.debian.org/debian`
makes the root filesystem; run as root: it mounts.)
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchlib import REWIND, ROOT, api, remember_token, environment, wait_archived, write_section

# (dedupe percentage, compress percentage) settings for fio
FIO_SETTINGS = [(0, 0), (50, 0), (0, 50), (50, 50), (80, 80)]




def run(*command, **kwargs):
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout


def fio_part(http, nbd, size):
    rows = []
    for dedupe, compress in FIO_SETTINGS:
        name = f"fio-d{dedupe}-c{compress}"
        api(http, "POST", "/v1/volumes", {"name": name, "size_bytes": size})
        run("fio", "--name=space", "--ioengine=nbd", f"--uri=nbd://{nbd}/{name}", "--rw=write", "--bs=4k",
            "--iodepth=16", f"--size={size}", "--randseed=1", "--refill_buffers",
            f"--dedupe_percentage={dedupe}", f"--buffer_compress_percentage={compress}",
            "--buffer_compress_chunk=4k", "--output-format=json")
        stats = wait_archived(http, name)
        row = {
            "setting": (dedupe, compress),
            "dedup_generated": 1 / (1 - dedupe / 100),
            "compression_generated": 1 / (1 - compress / 100),
            "dedup": stats["dedup_ratio"],
            "compression": stats["compression_ratio"],
            "logical": stats["logical_bytes"],
            "packs": stats["pack_bytes"],
        }
        rows.append(row)
        print(f"{name}: dedup {row['dedup']:.2f} (generated {row['dedup_generated']:.2f}), compression "
              f"{row['compression']:.2f} (generated {row['compression_generated']:.2f})", flush=True)
    return rows


def os_image_part(http, nbd, rootfs, work):
    """Copies `rootfs` twice into ext4 on a volume; returns per-copy bytes."""
    name = "os"
    api(http, "POST", "/v1/volumes", {"name": name, "size_bytes": 4 << 30})
    fuse = work / "fuse"
    mount = work / "mnt"
    fuse.mkdir()
    mount.mkdir()
    nbdfuse = subprocess.Popen(["nbdfuse", str(fuse / "disk"), f"nbd://{nbd}/{name}"])
    try:
        deadline = time.time() + 30
        while not (fuse / "disk").exists():
            if time.time() > deadline:
                raise RuntimeError("nbdfuse did not start")
            time.sleep(0.1)
        loop = run("losetup", "-f", "--show", str(fuse / "disk")).strip()
        try:
            run("mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop)
            run("mount", loop, str(mount))
            steps = []
            try:
                for copy in ["first", "second"]:
                    before = api(http, "GET", f"/v1/volumes/{name}")["stats"]["write_bytes"]
                    run("cp", "-a", str(rootfs), str(mount / copy))
                    run("sync", "-f", str(mount))
                    stats = wait_archived(http, name)
                    written = api(http, "GET", f"/v1/volumes/{name}")["stats"]["write_bytes"] - before
                    steps.append({"copy": copy, "written": written, "packs": stats["pack_bytes"],
                                  "logical": stats["logical_bytes"], "dedup": stats["dedup_ratio"],
                                  "compression": stats["compression_ratio"]})
                    print(f"os image, {copy} copy: {written / 2**20:.0f} MiB written, packs now "
                          f"{stats['pack_bytes'] / 2**20:.0f} MiB", flush=True)
            finally:
                run("umount", str(mount))
        finally:
            run("losetup", "-d", loop)
    finally:
        nbdfuse.terminate()
        nbdfuse.wait(timeout=60)
    return steps




def section(fio_rows, os_steps, rootfs_bytes, env):
    lines = [
        "<!-- space:begin (written by bench/space.py; do not edit by hand) -->",
        "## Space: deduplication and compression of archived history",
        "",
        f"`python3 bench/space.py` on {env['date']}, commit {env['commit']}, {env['fio']}.",
        "",
        "fio writes a 1 GiB volume once, sequentially in 4 KiB blocks (`--refill_buffers`, "
        "`--buffer_compress_chunk=4k`), with the deduplication and compression it is told to generate; the "
        "ratios are those of the volume's archived history (`rewind stats VOLUME`: logical bytes ÷ distinct "
        "raw bytes, and distinct raw ÷ stored bytes).",
        "",
        "| fio dedupe % / compress % | dedup generated | dedup achieved | compression generated | "
        "compression achieved | stored ÷ logical |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in fio_rows:
        dedupe, compress = row["setting"]
        lines.append(
            f"| {dedupe} / {compress} | {row['dedup_generated']:.2f} | {row['dedup']:.2f} | "
            f"{row['compression_generated']:.2f} | {row['compression']:.2f} | "
            f"{row['packs'] / row['logical']:.3f} |"
        )
    lines += [
        "",
        f"An operating system image: a Debian 12 root filesystem (debootstrap minbase, "
        f"{rootfs_bytes / 2**20:.0f} MiB of files) copied twice with `cp -a` into ext4 on a 4 GiB volume "
        "(nbdfuse + loop device), `sync` after each copy. Bytes written are what reached the volume over "
        "NBD (ext4's metadata and journal included); stored is what the chunk store grew by.",
        "",
        "| copy | written to the volume | stored | stored per byte written | dedup / compression of the "
        "history so far |",
        "|---|---:|---:|---:|---|",
    ]
    stored_before = 0
    for step in os_steps:
        stored = step["packs"] - stored_before
        stored_before = step["packs"]
        lines.append(
            f"| {step['copy']} | {step['written'] / 2**20:.0f} MiB | {stored / 2**20:.0f} MiB | "
            f"{stored / step['written']:.3f} | {step['dedup']:.2f} / {step['compression']:.2f} |"
        )
    total_written = sum(step["written"] for step in os_steps)
    lines.append(
        f"| both | {total_written / 2**20:.0f} MiB | {stored_before / 2**20:.0f} MiB | "
        f"{stored_before / total_written:.3f} | |"
    )
    lines.append("<!-- space:end -->")
    return "\n".join(lines)




def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--rootfs", required=True, type=Path)
    parser.add_argument("--dir", default=str(ROOT / "target" / "bench-space"))
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args()
    for tool in ["fio", "nbdfuse", "losetup", "mkfs.ext4"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install fio libnbd-bin util-linux e2fsprogs")
    if not (args.rootfs / "etc" / "debian_version").exists():
        sys.exit(f"{args.rootfs} is not a Debian root filesystem (see the header of this script)")
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "rewind-cli"], cwd=ROOT, check=True)
    size = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[args.size[-1]] * int(args.size[:-1])
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    nbd, http = "127.0.0.1:10911", "127.0.0.1:10912"
    server = subprocess.Popen(
        [str(REWIND), "serve", "--data-dir", str(work / "rewind"), "--nbd", nbd, "--http", http,
         "--archive-interval", "1s"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "warn"})
    try:
        while "listening http" not in server.stdout.readline():
            pass
        remember_token(http, work / "rewind")
        env = environment()
        fio_rows = fio_part(http, nbd, size)
        rootfs_bytes = int(run("du", "-sb", str(args.rootfs)).split()[0])
        os_steps = os_image_part(http, nbd, args.rootfs, work)
    finally:
        server.terminate()
        server.wait(timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    text = section(fio_rows, os_steps, rootfs_bytes, env)
    write_section("space", text)
    print(text)


if __name__ == "__main__":
    main()
