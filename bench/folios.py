#!/usr/bin/env python3
"""What the length of a buffered write costs later (the current store's
`WRITE_PIECE_BYTES`): the page cache sizes a buffered write's folios by its
length, and ext4 walks every buffer head of a folio on each write into it and
on its writeback. So a file filled in long writes makes each later 4 KiB write
into it cost as much as the folio is large.

Per piece length, in rotating order: a file of `--size` on the data
filesystem filled sequentially with `pwrite`s of that length (1 MiB at a time
split into pieces), then overwritten by 65,536 random 4 KiB `pwrite`s (what
the destager does after random writes), then read back sequentially from the
page cache in 1 MiB `pread`s. CPU time of this process per MiB filled, per
random write and per MiB read (min / median / max), and the random write's
cost ÷ the one after a fill in 1 MiB writes. Python adds about 1 µs per call
to every row alike.

Usage: python3 bench/folios.py [--runs 3] [--size 1G] [--dir /var/tmp]
"""

import argparse
import os
import random
import statistics
import time
from pathlib import Path

from benchlib import environment, publish, size_of, spread

PIECES = [4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20]
RANDOM_WRITES = 65536
MIB = 1 << 20


def cpu():
    return time.process_time()


def measure(path, piece, size, rng):
    """CPU seconds per MiB filled, per random 4 KiB write, per MiB read."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        run = memoryview(os.urandom(MIB))
        start = cpu()
        for offset in range(0, size, MIB):
            for at in range(0, MIB, piece):
                os.pwrite(fd, run[at:at + piece], offset + at)
        fill = (cpu() - start) / (size / MIB)
        os.fsync(fd)
        block = os.urandom(4096)
        offsets = [rng.randrange(size // 4096) * 4096 for _ in range(RANDOM_WRITES)]
        start = cpu()
        for offset in offsets:
            os.pwrite(fd, block, offset)
        overwrite = (cpu() - start) / RANDOM_WRITES
        os.fsync(fd)
        start = cpu()
        for offset in range(0, size, MIB):
            assert len(os.pread(fd, MIB, offset)) == MIB
        read = (cpu() - start) / (size / MIB)
        return fill, overwrite, read
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--dir", default="/var/tmp")
    args = parser.parse_args()
    size = size_of(args.size)
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    rng = random.Random(seed)
    path = Path(args.dir) / f"rewind-folios-{os.getpid()}.img"
    results = {piece: [] for piece in PIECES}
    for run in range(args.runs):
        order = PIECES if run % 2 == 0 else list(reversed(PIECES))
        for piece in order:
            results[piece].append(measure(path, piece, size, rng))
            fill, overwrite, read = results[piece][-1]
            print(f"run {run} piece {piece >> 10} KiB: fill {fill * 1e3:.3f} ms/MiB, "
                  f"random 4 KiB write {overwrite * 1e6:.1f} µs, read {read * 1e3:.3f} ms/MiB", flush=True)
    env = environment()
    baseline = statistics.median(overwrite for _, overwrite, _ in results[MIB])
    lines = [
        "<!-- folios:begin (written by bench/folios.py; do not edit by hand) -->",
        "## The length of the current store's writes (page-cache folios)",
        "",
        f"`python3 bench/folios.py --runs {args.runs} --size {args.size}` — {env['date']}, commit {env['commit']}, "
        f"{env['cpu']}, {env['memory']}, Linux {env['kernel']}, on the filesystem of `{args.dir}`; seed {seed}. "
        "A file filled sequentially in `pwrite`s of the piece's length, overwritten by 65,536 random 4 KiB "
        "`pwrite`s, read back from the page cache in 1 MiB `pread`s; CPU time (min / median / max).",
        "",
        "| piece | fill, ms per MiB | random 4 KiB write after it, µs | ÷ after 1 MiB pieces (median) | read, ms per MiB |",
        "|---:|---|---|---:|---|",
    ]
    for piece in PIECES:
        fills, overwrites, reads = zip(*results[piece])
        lines.append(
            f"| {piece >> 10} KiB | {spread([f * 1e3 for f in fills], 3)} | {spread([o * 1e6 for o in overwrites], 1)} "
            f"| {statistics.median(overwrites) / baseline:.2f} | {spread([r * 1e3 for r in reads], 3)} |"
        )
    lines.append("<!-- folios:end -->")
    publish("folios", lines)


if __name__ == "__main__":
    main()
