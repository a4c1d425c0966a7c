#!/usr/bin/env python3
"""Bytes written per byte received, per layout (issue 13, reqs 2 and 7d).

Per layout and run, a fresh Rewind server and one 1 GiB volume in that
layout; over NBD, fio writes 256 MiB sequentially (1 MiB requests) and then
64 MiB of random 4 KiB overwrites within it, with a final flush; then the
server's background work (destaging, archiving) is let go quiet. The device
bytes each store wrote — the journal, the current store, the version index
and the chunk store (packs and their tables), as the server counts them
(`GET /v1/stats`) — divided by the 320 MiB received. The journal's bytes
are split in two: its records, and the zeros it wrote at rest into spare
segment files in place of those the chunk store adopted (`rewind serve
--no-journal-spares-ahead` leaves them out, and its next burst writes into
new files). The granularity is every write (nothing dropped before
history); controller caches are 64 MiB.

Usage: python3 bench/amplification.py [--runs 3]
"""

import argparse
import shutil

from benchlib import api, environment, fio, remember_token, spread, start_server, wait_archived, wait_port, write_section

LAYOUTS = ["journaled", "logging", "split-stream", "split-down-stream", "checkpointing", "cow", "row"]
STORES = ["journal", "current", "index", "chunks"]
# The journal's bytes as two columns: its records, and its spares' zeros.
COLUMNS = ["records", "spares", *STORES[1:]]
NBD, HTTP = 10995, 10996
SEQUENTIAL, RANDOM = 256 << 20, 64 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-amplification")
    args = parser.parse_args()
    received = SEQUENTIAL + RANDOM
    ratios = {layout: {column: [] for column in [*COLUMNS, "total"]} for layout in LAYOUTS}
    for run in range(args.runs):
        for layout in LAYOUTS:
            work, data, server = start_server(args.dir, NBD, HTTP)
            try:
                wait_port(NBD)
                http = f"127.0.0.1:{HTTP}"
                remember_token(http, data)
                api(http, "POST", "/v1/volumes", {"name": "v", "size_bytes": 1 << 30, "layout": layout})
                uri = f"nbd://127.0.0.1:{NBD}/v"
                fio(uri, "fill", ["--rw=write", "--bs=1m", "--iodepth=4"], str(SEQUENTIAL))
                fio(uri, "overwrite", ["--rw=randwrite", "--bs=4k", "--iodepth=16", "--end_fsync=1"],
                    str(SEQUENTIAL), extra=[f"--io_size={RANDOM}"])
                wait_archived(http, "v")
                io = api(http, "GET", "/v1/stats")["io"]
                spares = api(http, "GET", "/v1/volumes/v")["stats"]["journal_spare_bytes_written"]
            finally:
                server.stop()
                shutil.rmtree(work, ignore_errors=True)
            written = {store: io[store]["write_bytes"] for store in STORES}
            written["records"] = written.pop("journal") - spares
            written["spares"] = spares
            for column in COLUMNS:
                ratios[layout][column].append(written[column] / received)
            ratios[layout]["total"].append(sum(written.values()) / received)
            shown = "  ".join(f"{column} {ratios[layout][column][-1]:.2f}" for column in [*COLUMNS, "total"])
            print(f"run {run} {layout:18} {shown}", flush=True)
    env = environment()
    lines = [
        "<!-- amplification:begin (written by bench/amplification.py; do not edit by hand) -->",
        "## Bytes written per byte received, per layout (issue 13)",
        "",
        f"`python3 bench/amplification.py --runs {args.runs}` — {env['date']}, commit {env['commit']}, {env['cpu']}, "
        f"{env['memory']}, {env['fio']}. Per layout a fresh server and a 1 GiB volume; over NBD 256 MiB written "
        "sequentially (1 MiB requests), then 64 MiB of random 4 KiB overwrites within it and a flush; the "
        "background work then let go quiet. Device bytes each store wrote ÷ the 320 MiB received (min / median / "
        "max over the runs); every-write granularity, 64 MiB controller caches. The journal's bytes in two columns: "
        "its records, and the zeros it wrote at rest into spare segment files in place of those the chunk store "
        "adopted, so that the next burst writes into written blocks (`--no-journal-spares-ahead` leaves them out).",
        "",
        "| layout | journal records | journal spares written at rest | current store | version index | chunk store "
        "| total |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for layout in LAYOUTS:
        cells = " | ".join(spread(ratios[layout][column]) for column in [*COLUMNS, "total"])
        lines.append(f"| {layout} | {cells} |")
    lines.append("<!-- amplification:end -->")
    section = "\n".join(lines)
    print(section)
    write_section("amplification", section)


if __name__ == "__main__":
    main()
