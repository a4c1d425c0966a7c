#!/usr/bin/env python3
"""A view after a defrag against the present, by build (issue 13, req 3):
throughput and the server's CPU per GiB read — a diagnosis for the by-hand
sections of BENCHMARKS.md, not a table of its own.

Per history and build (the builds alternate): a fresh server, a 512 MiB
volume filled, written over twice sequentially, then 4 KiB random writes at
QD 32 and at QD 1 synced every 8 (3 s each), archived; bookmarked `old`;
every block overwritten at random, then a sequential pass and 3 s of random
writes, archived (so the view of `old` reads history among other versions
of every block); `rewind volume defrag vol@old`, or with `--background`
only the server's own layout of the bookmark's history, or with
`--no-defrag` neither (the history as archived: the server is started with
`--no-bookmark-layout`, which builds before 2026-12-04 lack).
Then rounds of a 1 MiB sequential read of the view and one of the live
volume, the first round left out (it pays for the page cache's first
touch), or with `--cold` every round, the page cache dropped before each
read (the packs, the index and the current store then come from the
disk). The server process's
CPU time (`/proc/PID/stat`, all threads) around each read, divided by the
GiB it served: on a machine whose cores fio shares, what sets the pace.

    python3 bench/view_cpu.py --histories 2 --rounds 6 OLD_BUILD NEW_BUILD
"""

import argparse
import subprocess
from pathlib import Path

import benchlib
from benchlib import api, drop_caches, fio, serve_volume, spread, wait_archived
from present_cpu import cpu_seconds

NBD, HTTP = 11980, 11981
SIZE = "512M"
READ = ["--rw=read", "--bs=1m", "--iodepth=4", "--readonly"]
HISTORY = [("fill", ["--rw=write", "--bs=1m", "--iodepth=4"], None),
           ("seqwrite", ["--rw=write", "--bs=1m", "--iodepth=4", "--io_size=1G"], None),
           ("randwrite", ["--rw=randwrite", "--bs=4k", "--iodepth=32"], 3),
           ("randwrite-synced", ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=8"], 3)]
AFTER = [("overwrite", ["--rw=randwrite", "--bs=4k", "--iodepth=32"], None),
         ("seqwrite-after", ["--rw=write", "--bs=1m", "--iodepth=4"], None),
         ("randwrite-after", ["--rw=randwrite", "--bs=4k", "--iodepth=32"], 3)]


def read(uri, pid, cold):
    """(MiB/s, server CPU-s per GiB) of one read of the volume."""
    if cold:
        drop_caches()
    before = cpu_seconds(pid)
    job = fio(uri, "seqread", READ, SIZE)["read"]
    return job["bw_bytes"] / 2**20, (cpu_seconds(pid) - before) / (job["io_bytes"] / 2**30)


def one_history(build, args):
    """Per round after the first: ((view MiB/s, CPU-s/GiB), (live MiB/s, CPU-s/GiB))."""
    benchlib.REWIND = build
    options = ["--archive-interval", "5s"] + ([] if args.defrag else ["--no-bookmark-layout"])
    server, http, live = serve_volume(args.work, NBD, HTTP, "v", 1 << 29, options)
    try:
        for name, job, runtime in HISTORY:
            fio(live, name, job, SIZE, runtime=runtime)
        wait_archived(http, "v")
        at = api(http, "POST", "/v1/volumes/v/bookmarks", {"name": "old"})["at"]
        for name, job, runtime in AFTER:
            fio(live, name, job, SIZE, runtime=runtime)
        wait_archived(http, "v")
        if args.defrag and not args.background:
            data = Path(args.work) / "data"
            subprocess.run([str(build), "--server", f"http://{http}", "--data-dir", str(data), "volume", "defrag",
                            "v@old"], check=True, capture_output=True)
        view = f"{live}@{at}"
        pid = server.process.pid
        rounds = [(read(view, pid, args.cold), read(live, pid, args.cold)) for _ in range(args.rounds)]
        return rounds if args.cold else rounds[1:]
    finally:
        server.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", type=Path, help="rewind binaries to compare")
    parser.add_argument("--histories", type=int, default=2, help="fresh histories per build")
    parser.add_argument("--rounds", type=int, default=6, help="view and live reads per history")
    parser.add_argument("--no-defrag", dest="defrag", action="store_false", help="read the history as archived")
    parser.add_argument("--background", action="store_true",
                        help="read the history as the server laid it out by itself (no `volume defrag`)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before every read")
    parser.add_argument("--work", default="/var/tmp/rewind-view-cpu", help="the server's work directory (emptied)")
    args = parser.parse_args()
    if args.background and not args.defrag:
        parser.error("--background and --no-defrag are two different histories: choose one")
    if args.rounds < 2 and not args.cold:
        parser.error("--rounds must be at least 2: the first round is left out")
    pairs = {build: [] for build in args.builds}
    for history in range(args.histories):
        for build in args.builds if history % 2 == 0 else args.builds[::-1]:
            got = one_history(build, args)
            pairs[build] += got
            print(f"history {history + 1} {build}: " + ", ".join(
                f"view {view[0]:.0f} MiB/s {view[1]:.2f} CPU-s/GiB, live {live[0]:.0f} {live[1]:.2f}"
                for view, live in got), flush=True)
    for build, got in pairs.items():
        print(f"{build}: view ÷ live {spread([view[0] / live[0] for view, live in got])}; "
              f"view MiB/s {spread([view[0] for view, _ in got], 0)}; "
              f"server CPU-s per GiB, view {spread([view[1] for view, _ in got])}, "
              f"live {spread([live[1] for _, live in got])}")


if __name__ == "__main__":
    main()
