#!/usr/bin/env python3
"""A thin terabyte: mapping, copying out and diffing a volume that is mostly
never written (issue 13, req 3: views and restores at the speed of the
present).

One Rewind server with a 1 TiB volume: 8 MiB written at 0 and at 512 GiB,
bookmarked `two`, then 8 MiB more at 4 MiB. Beside it, `nbdkit file` on a
sparse 1 TiB raw file on the same filesystem holding the same bytes: what a
user would pick instead, whose map comes from the filesystem's holes
(`SEEK_DATA`). Per run, in alternating order, each command once:

- `nbdinfo --map` of Rewind's present, of the view `@two`, and of nbdkit's
  file;
- a sparse copy to a file: `nbdcopy --flush` of the view and of nbdkit's
  file, and `rewind restore big@two --to FILE`;
- `rewind diff big@two` (no baseline: nbdkit keeps no past);
- the device's limit for what a copy of the view must write: fio 1 MiB
  sequential writes with `--direct=1` of its 16 MiB of data to a file on
  the same filesystem, synced at the end.

Reports milliseconds (min / median / max) and, where there is a baseline,
nbdkit's time ÷ Rewind's (above 1: Rewind is faster). Every copy is checked
against the bytes written.

Usage: python3 bench/thin.py [--runs 5]
"""

import argparse
import shutil
import subprocess

from benchlib import REWIND, Process, api, environment, publish, remember_token, spread, start_server, timed, wait_port

NBD, HTTP, BASE = 10951, 10952, 10953
SIZE = 1 << 40
WRITES_BEFORE = [("0x33", 0), ("0x44", 512 << 30)]
WRITE_AFTER = ("0x55", 4 << 20)


def qemu_io_writes(target, writes, image_format="raw"):
    commands = [arg for pattern, offset in writes for arg in ("-c", f"write -P {pattern} {offset} 8M")]
    subprocess.run(["qemu-io", "-f", image_format, *commands, target], check=True, capture_output=True)


def check_copy(path, expected):
    """The copy holds the `expected` (pattern, offset, bytes)."""
    reads = [arg for pattern, offset, length in expected for arg in ("-c", f"read -P {pattern} {offset} {length}")]
    out = subprocess.run(["qemu-io", "-f", "raw", *reads, str(path)], capture_output=True, text=True)
    if out.returncode != 0 or out.stdout.count("read ") != len(expected) or "failed" in out.stdout:
        raise RuntimeError(f"{path} does not hold what was written:\n{out.stdout}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-thin")
    args = parser.parse_args()
    work, data, server = start_server(args.dir, NBD, HTTP)
    base_file = work / "nbdkit.img"
    with open(base_file, "wb") as file:
        file.truncate(SIZE)
    qemu_io_writes(str(base_file), [*WRITES_BEFORE, WRITE_AFTER])
    nbdkit = Process(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(BASE), "file", str(base_file)])
    rewind = [str(REWIND), "--server", f"http://127.0.0.1:{HTTP}", "--data-dir", str(data)]
    present, view, base = f"nbd://127.0.0.1:{NBD}/big", f"nbd://127.0.0.1:{NBD}/big@two", f"nbd://127.0.0.1:{BASE}/"
    copy = work / "copy.raw"
    jobs = {
        "map-present": ["nbdinfo", "--map", present],
        "map-view": ["nbdinfo", "--map", view],
        "map-nbdkit": ["nbdinfo", "--map", base],
        "restore": [*rewind, "restore", "big@two", "--to", str(copy), "--force"],
        "nbdcopy-view": ["nbdcopy", "--flush", view, str(copy)],
        "nbdcopy-nbdkit": ["nbdcopy", "--flush", base, str(copy)],
        "diff": [*rewind, "diff", "big@two"],
        "fio-direct": ["fio", "--name=limit", f"--filename={copy}", "--rw=write", "--bs=1M", "--direct=1",
                       "--iodepth=8", "--ioengine=libaio", "--size=16M", "--end_fsync=1", "--output-format=json"],
    }
    # What each copy holds: the view's two writes; the present's third over half of the first.
    view_bytes = [(pattern, offset, 8 << 20) for pattern, offset in WRITES_BEFORE]
    present_bytes = [("0x33", 0, 4 << 20), ("0x55", 4 << 20, 8 << 20), ("0x44", 512 << 30, 8 << 20)]
    copies = {"restore": view_bytes, "nbdcopy-view": view_bytes, "nbdcopy-nbdkit": present_bytes}
    millis = {name: [] for name in jobs}
    try:
        wait_port(NBD)
        wait_port(BASE)
        http = f"127.0.0.1:{HTTP}"
        remember_token(http, data)
        api(http, "POST", "/v1/volumes", {"name": "big", "size_bytes": SIZE})
        qemu_io_writes(present, WRITES_BEFORE)
        api(http, "POST", "/v1/volumes/big/bookmarks", {"name": "two"})
        qemu_io_writes(present, [WRITE_AFTER])
        for index in range(args.runs):
            order = list(jobs) if index % 2 == 0 else list(reversed(jobs))
            for name in order:
                copy.unlink(missing_ok=True)
                if name == "nbdcopy-view" or name == "nbdcopy-nbdkit":
                    # nbdcopy writes into a file of the size already there.
                    with open(copy, "wb") as file:
                        file.truncate(SIZE)
                took, _ = timed(jobs[name])
                millis[name].append(took * 1000)
                if name in copies:
                    check_copy(copy, copies[name])
                print(f"run {index} {name:15}: {took * 1000:9.1f} ms", flush=True)
    finally:
        server.stop()
        nbdkit.stop()
        shutil.rmtree(work, ignore_errors=True)
    env = environment()
    faster = lambda rewind, base: spread([b / r for r, b in zip(millis[rewind], millis[base])])
    lines = [
        "<!-- thin:begin (written by bench/thin.py; do not edit by hand) -->",
        "## A thin terabyte: map, copy out, diff (issue 13, req 3)",
        "",
        f"`python3 bench/thin.py --runs {args.runs}` — {env['date']}, commit {env['commit']}, {env['cpu']}, "
        f"{env['memory']}, {env['nbdkit']}. A 1 TiB volume with 8 MiB written at 0 and at 512 GiB (bookmarked "
        "`two`), then 8 MiB at 4 MiB; beside it `nbdkit file` on a sparse 1 TiB raw file of the same bytes on "
        "the same filesystem. Each command once per run, alternating order; milliseconds (min / median / max), "
        "and nbdkit's time ÷ Rewind's (above 1: Rewind faster). Every copy checked against what was written.",
        "",
        "| command | Rewind ms | nbdkit file ms | nbdkit ÷ Rewind |",
        "|---|---:|---:|---:|",
        f"| `nbdinfo --map` of the present | {spread(millis['map-present'], 1)} | {spread(millis['map-nbdkit'], 1)} | "
        f"{faster('map-present', 'map-nbdkit')} |",
        f"| `nbdinfo --map` of the view `@two` | {spread(millis['map-view'], 1)} | {spread(millis['map-nbdkit'], 1)} | "
        f"{faster('map-view', 'map-nbdkit')} |",
        f"| `nbdcopy --flush` of the view to a sparse file | {spread(millis['nbdcopy-view'], 1)} | "
        f"{spread(millis['nbdcopy-nbdkit'], 1)} | {faster('nbdcopy-view', 'nbdcopy-nbdkit')} |",
        f"| `rewind restore big@two --to FILE` (through the API) | {spread(millis['restore'], 1)} | "
        f"{spread(millis['nbdcopy-nbdkit'], 1)} | {faster('restore', 'nbdcopy-nbdkit')} |",
        f"| `rewind diff big@two` | {spread(millis['diff'], 1)} | — | — |",
        "",
        f"The device's limit for what a copy of the view writes (fio 1 MiB sequential writes, `--direct=1`, of its "
        f"16 MiB of data, synced at the end): {spread(millis['fio-direct'], 1)} ms; ÷ `rewind restore` "
        f"{faster('restore', 'fio-direct')}, ÷ `nbdcopy` of the view {faster('nbdcopy-view', 'fio-direct')} "
        "(1 would be a copy at the device's speed).",
        "<!-- thin:end -->",
    ]
    publish("thin", lines)


if __name__ == "__main__":
    main()
