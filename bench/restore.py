#!/usr/bin/env python3
"""Restore speed and incremental restore size (issue 12, reqs 5 and 10).

One Rewind server; a 1 GiB volume written sequentially with 768 MiB of
random data by fio (the rest never written: a hole), bookmarked `full`;
then 32 MiB of random 4 KiB writes, bookmarked `later`. Per run, in
alternating order, the same view written to a file on the same filesystem
by:

- `rewind restore db@full --to FILE` (through the server's API);
- `nbdcopy --flush nbd://…/db@full FILE` — what a user would pick instead;
- `cp --sparse=always` of a raw image of it, then `sync FILE` — a plain
  file copy (each tool ends with the data durable, as `rewind restore`
  does);
- and the device's limit: fio sequential 1 MiB writes with `--direct=1`
  to a file of the same size on the same filesystem.

Then `rewind restore db@later --to COPY --since full` onto a copy of the
`full` restore: bytes moved against the bytes `rewind diff` says changed,
and the result compared with the view (`qemu-img compare`).

Reports MiB/s of the volume's size (min / median / max) and the ratios
Rewind ÷ each baseline, and moved ÷ changed.

Usage: python3 bench/restore.py [--runs 3]
"""

import argparse
import json
import shutil
import subprocess

from benchlib import REWIND, api, environment, fio, remember_token, spread, start_server, timed, wait_archived, wait_port, write_section

NBD, HTTP = 10941, 10942
SIZE = 1 << 30




def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-restore")
    args = parser.parse_args()
    work, data, server = start_server(args.dir, NBD, HTTP)
    rewind = [str(REWIND), "--server", f"http://127.0.0.1:{HTTP}", "--data-dir", str(data)]
    seconds = {"rewind": [], "nbdcopy": [], "cp": [], "fio-direct": []}
    incremental = []
    try:
        wait_port(NBD)
        http = f"127.0.0.1:{HTTP}"
        remember_token(http, data)
        api(http, "POST", "/v1/volumes", {"name": "db", "size_bytes": SIZE})
        uri = f"nbd://127.0.0.1:{NBD}/db"
        fio(uri, "fill", ["--rw=write", "--bs=1M", "--iodepth=8"], "768M")
        api(http, "POST", "/v1/volumes/db/bookmarks", {"name": "full"})
        fio(uri, "change", ["--rw=randwrite", "--bs=4k", "--iodepth=16", "--io_size=32M"], "1G")
        api(http, "POST", "/v1/volumes/db/bookmarks", {"name": "later"})
        wait_archived(http, "db")
        view = f"nbd://127.0.0.1:{NBD}/db@full"
        image = work / "image.raw"
        subprocess.run(["nbdcopy", view, str(image)], check=True)
        for index in range(args.runs):
            jobs = {
                "rewind": [*rewind, "restore", "db@full", "--to", str(work / "restored.raw"), "--force"],
                "nbdcopy": ["nbdcopy", "--flush", view, str(work / "copied.raw")],
                "cp": ["sh", "-c", f"cp --sparse=always {image} {work / 'cp.raw'} && sync {work / 'cp.raw'}"],
                "fio-direct": ["fio", "--name=limit", f"--filename={work / 'direct.raw'}", "--rw=write", "--bs=1M",
                               "--direct=1", "--iodepth=8", "--ioengine=libaio", f"--size={SIZE}",
                               "--end_fsync=1", "--output-format=json"],
            }
            order = list(jobs) if index % 2 == 0 else list(reversed(jobs))
            for name in order:
                for stale in ["restored.raw", "copied.raw", "cp.raw", "direct.raw"]:
                    (work / stale).unlink(missing_ok=True)
                subprocess.run(["sync"], check=True)
                took, _ = timed(jobs[name])
                seconds[name].append(took)
                print(f"run {index} {name:10}: {took:6.2f} s, {SIZE / took / (1 << 20):7.0f} MiB/s", flush=True)
            # Incremental: onto a copy of the full restore.
            shutil.copyfile(image, work / "inc.raw")
            _, text = timed([*rewind, "restore", "db@later", "--to", str(work / "inc.raw"), "--since", "full",
                             "--json"])
            moved = json.loads(text)["bytes_moved"]
            _, text = timed([*rewind, "diff", "db@full", "db@later", "--json"])
            changed = json.loads(text)["changed_bytes"]
            subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", str(work / "inc.raw"),
                            f"nbd://127.0.0.1:{NBD}/db@later"], check=True)
            incremental.append((moved, changed))
            print(f"run {index} incremental: moved {moved} bytes, changed {changed} bytes", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    env = environment()
    mib_s = {name: [SIZE / took / (1 << 20) for took in values] for name, values in seconds.items()}
    ratio = lambda base: [r / b for r, b in zip(mib_s["rewind"], mib_s[base])]
    lines = [
        "<!-- restore:begin (written by bench/restore.py; do not edit by hand) -->",
        "## Restore: full and incremental (issue 12)",
        "",
        f"`python3 bench/restore.py --runs {args.runs}` — {env['date']}, commit {env['commit']}, {env['cpu']}, "
        f"{env['memory']}, {env['fio']}, {env['nbdkit']}. A 1 GiB volume, 768 MiB written (the rest a hole), "
        "written as it was at a bookmark to a file on the same filesystem by each tool in turn, alternating "
        "order, each ending with the data durable; MiB/s of the volume's size (min / median / max over the runs).",
        "",
        "| writer | MiB/s | Rewind ÷ it |",
        "|---|---:|---:|",
        f"| `rewind restore` (the view through the API, sparse) | {spread(mib_s['rewind'], 0)} | — |",
        f"| `nbdcopy --flush` of the same view over NBD | {spread(mib_s['nbdcopy'], 0)} | {spread(ratio('nbdcopy'))} |",
        f"| `cp --sparse=always` of a raw image of it, then `sync` | {spread(mib_s['cp'], 0)} | {spread(ratio('cp'))} |",
        f"| fio 1 MiB sequential writes, `--direct=1` (the device's limit) | {spread(mib_s['fio-direct'], 0)} | "
        f"{spread(ratio('fio-direct'))} |",
        "",
        f"Incremental (`--since full` onto a copy of the `full` restore, 32 MiB of random 4 KiB writes between): "
        f"bytes moved ÷ bytes changed = {spread([m / c for m, c in incremental], 3)} "
        f"({incremental[0][0]:,} bytes moved), and the result equals the view (`qemu-img compare`).",
        "<!-- restore:end -->",
    ]
    section = "\n".join(lines)
    print(section)
    write_section("restore", section)


if __name__ == "__main__":
    main()
