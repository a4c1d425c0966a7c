#!/usr/bin/env python3
"""Views at the speed of the present? (issue 13, reqs 3 and 7c)

One Rewind server; per case a 1 GiB volume filled by 1 MiB sequential
writes, then bookmarked `old`, then random 4 KiB overwrites of one block in
eight, or of every block once, and the server's archiving let go quiet (the
history a view of `old` needs is then in the chunk store). In the third
case, write jobs run between the fill and the bookmark (1 MiB sequential
writes, 4 KiB random writes at QD 32, and at QD 1 synced every 8, each
time-based) and are archived first: the state at `old` is then the last of
several versions per block in each archive pass, spread over the passes. Per run, in
alternating order, fio 1 MiB sequential reads (QD 4, time-based) of the live
volume and of the view `vol@old` over NBD; view ÷ live. Then one more pass
over the whole view, not timed, with the chunk store's file reads counted
around it (`/v1/stats`, io.chunks): the bytes it read per byte of the view,
and its reads per MiB. Where the history a view needs lies together that is
a little over the share of the view held in the chunk store (record headers
and table slots); gaps between the records it needs, read through, add the
rest. Then `rewind volume defrag vol@old` lays that history out in block
order (timed: the view's size ÷ its seconds), and the reads are measured
again: the view after the defrag ÷ the live read, in the same alternation.
The server runs with `--no-bookmark-layout`, so the first reads are of the
history as archived (by default the server lays out a bookmark's history by
itself once it is archived: bench/nbd.py measures that).

Usage: python3 bench/views.py [--runs 5] [--runtime 8]
"""

import argparse
import json
import shutil

from benchlib import (REWIND, api, environment, fio, remember_token, spread, start_server, timed, wait_archived,
                      wait_port, write_section)

NBD, HTTP = 10997, 10998
SIZE = 1 << 30
READ = ["--rw=read", "--bs=1m", "--iodepth=4"]
# What the overwrite covers, in eighths of the volume, and whether write
# jobs give the volume a history of many versions per block before `old`.
CASES = {"one block in eight": (1, False), "every block": (8, False),
         "every block, after write jobs": (8, True)}
HISTORY_JOBS = [("seqwrite", ["--rw=write", "--bs=1m", "--iodepth=4"]),
                ("randwrite", ["--rw=randwrite", "--bs=4k", "--iodepth=32"]),
                ("randwrite-synced", ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=8"])]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--runtime", type=int, default=8)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-views")
    args = parser.parse_args()
    work, data, server = start_server(args.dir, NBD, HTTP, ["--no-bookmark-layout"])
    rewind = [str(REWIND), "--server", f"http://127.0.0.1:{HTTP}", "--data-dir", str(data)]
    mib_s = {case: {"live": [], "view": [], "live after": [], "view after": []} for case in CASES}
    chunk_reads = {}
    defrags = {}
    try:
        wait_port(NBD)
        http = f"127.0.0.1:{HTTP}"
        remember_token(http, data)
        for number, (case, (eighths, history)) in enumerate(CASES.items()):
            volume = f"vol{number}"
            api(http, "POST", "/v1/volumes", {"name": volume, "size_bytes": SIZE})
            live, view = f"nbd://127.0.0.1:{NBD}/{volume}", f"nbd://127.0.0.1:{NBD}/{volume}@old"
            fio(live, "fill", ["--rw=write", "--bs=1m", "--iodepth=4", "--end_fsync=1"], str(SIZE))
            if history:
                for name, job in HISTORY_JOBS:
                    fio(live, name, job, str(SIZE), runtime=args.runtime)
                wait_archived(http, volume)
            api(http, "POST", f"/v1/volumes/{volume}/bookmarks", {"name": "old"})
            fio(live, "overwrite", ["--rw=randwrite", "--bs=4k", "--iodepth=16", "--end_fsync=1"], str(SIZE),
                extra=[f"--io_size={SIZE * eighths // 8}"])
            wait_archived(http, volume)
            for phase in ["", " after"]:
                if phase:
                    took, output = timed([*rewind, "volume", "defrag", f"{volume}@old", "--json"])
                    defrags[case] = (json.loads(output), SIZE / took / (1 << 20))
                    print(f"{case}: defrag {defrags[case][0]}, {defrags[case][1]:.0f} MiB/s", flush=True)
                for run in range(args.runs):
                    order = [("live" + phase, live), ("view" + phase, view)]
                    for name, uri in order if run % 2 == 0 else reversed(order):
                        result = fio(uri, name, READ, str(SIZE), runtime=args.runtime)
                        mib_s[case][name].append(result["read"]["bw_bytes"] / (1 << 20))
                        print(f"{case}, run {run} {name}: {mib_s[case][name][-1]:6.0f} MiB/s", flush=True)
                before = api(http, "GET", "/v1/stats")["io"]["chunks"]
                fio(view, "view-pass", READ, str(SIZE))
                after = api(http, "GET", "/v1/stats")["io"]["chunks"]
                chunk_reads[case + phase] = ((after["read_bytes"] - before["read_bytes"]) / SIZE,
                                             (after["reads"] - before["reads"]) / (SIZE >> 20))
                print(f"{case}{phase}: the chunk store read {chunk_reads[case + phase][0]:.2f} bytes per byte of "
                      f"the view, {chunk_reads[case + phase][1]:.0f} reads per MiB", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    env = environment()
    lines = [
        "<!-- views:begin (written by bench/views.py; do not edit by hand) -->",
        "## A view of the past against the present (issue 13)",
        "",
        f"`python3 bench/views.py --runs {args.runs} --runtime {args.runtime}` — {env['date']}, commit "
        f"{env['commit']}, {env['cpu']}, {env['memory']}, {env['fio']}. A 1 GiB volume written sequentially, "
        "bookmarked `old`, then random 4 KiB overwrites of one block in eight or of every block once, archiving let "
        "go quiet (in the last case, after write jobs archived before `old`: 1 MiB sequential writes, 4 KiB random "
        f"writes at QD 32 and at QD 1 synced every 8, {args.runtime} s each); fio "
        f"1 MiB sequential reads (`{' '.join(READ)}`, {args.runtime} s) of the live volume and of `vol@old` over NBD, "
        "alternating, the server started with `--no-bookmark-layout` (the history as archived). "
        "MiB/s (min / median / max). Then one pass over the whole view, not timed, with the chunk "
        "store's file reads counted around it (packs and chunk table, from the page cache or the disk): bytes read "
        "per byte of the view, and reads per MiB. Then `rewind volume defrag vol@old` (the history the view reads "
        "laid out in block order; MiB/s is the volume's size ÷ the command's seconds) and the same reads again.",
        "",
        "| overwritten since `old` | live MiB/s | view `vol@old` MiB/s | view ÷ live "
        "| chunk store bytes read per byte of the view | chunk store reads per MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case, reads in mib_s.items():
        for phase, label in [("", case), (" after", f"{case}; after `volume defrag`")]:
            ratios = [v / l for v, l in zip(reads["view" + phase], reads["live" + phase])]
            read_bytes, read_calls = chunk_reads[case + phase]
            lines.append(f"| {label} | {spread(reads['live' + phase], 0)} | {spread(reads['view' + phase], 0)} "
                         f"| {spread(ratios)} | {read_bytes:.2f} | {read_calls:.0f} |")
    lines += [
        "",
        "| overwritten since `old` | defrag: chunks laid out | runs they lay in before | MiB written | MiB/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for case, (summary, speed) in defrags.items():
        lines.append(f"| {case} | {summary['chunks_moved']} of {summary['chunks']} | {summary['runs_before']} "
                     f"| {summary['bytes_written'] / (1 << 20):.0f} | {speed:.0f} |")
    lines.append("<!-- views:end -->")
    section = "\n".join(lines)
    print(section)
    write_section("views", section)


if __name__ == "__main__":
    main()
