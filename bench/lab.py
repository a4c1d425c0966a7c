#!/usr/bin/env python3
"""The lab on a real trace (issue 16, item 6): `rewind lab analyze` of the
CloudPhysics VSCSI trace libCacheSim distributes (113,872 requests;
`scripts/fetch-traces.sh`), at the default seven granularities and three
cache sizes, under both conventions: wall-clock seconds and peak memory
(the process's maximum resident set, from wait4).

Read in the three forms the lab takes it: libCacheSim's vscsi and
oracleGeneral binaries (oracleGeneral has no reads: every request is a
write there, so it replays a heavier workload), and Rewind's csv (converted
here from the vscsi records). With `--before BINARY`, a `rewind` built
from an earlier commit analyses the csv in the same run, side by side.

Usage: python3 bench/lab.py [--runs 3] [--before /path/to/old/rewind]
"""

import argparse
import os
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from benchlib import REWIND, ROOT, environment, publish, spread

READS = {0x08, 0x28, 0xA8, 0x88}
WRITES = {0x0A, 0x2A, 0xAA, 0x8A}


def vscsi_to_csv(vscsi, csv):
    """Rewind's csv (`time,op,size,lbn`) of a vscsi v1 trace, times relative to its first record."""
    data = vscsi.read_bytes()
    lines, origin = ["time,op,size,lbn"], None
    for at in range(0, len(data), 32):
        _, length, _, command, _, lbn, micros = struct.unpack_from("<IIIHHQQ", data, at)
        op = "R" if command in READS else "W" if command in WRITES else None
        if op is None:
            continue
        origin = micros if origin is None else origin
        since = micros - origin
        lines.append(f"{since // 1_000_000}.{since % 1_000_000:06d},{op},{length},{lbn}")
    csv.write_text("\n".join(lines) + "\n")


def measure(binary, trace, convention, out):
    """Seconds and peak resident MB of one `lab analyze`."""
    command = [str(binary), "lab", "analyze", str(trace), "--out", str(out)]
    if convention:
        command += ["--convention", convention]
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.monotonic() - start
    if status != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {process.stderr.read().decode()}")
    return seconds, usage.ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", help="a rewind binary from an earlier commit, to analyse the csv beside this one")
    args = parser.parse_args()
    traces = Path(subprocess.run([ROOT / "scripts" / "fetch-traces.sh"], check=True, capture_output=True,
                                 text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        csv = scratch / "cloudPhysicsIO.csv"
        vscsi_to_csv(traces / "cloudPhysicsIO.vscsi", csv)
        cases = [
            ("vscsi", REWIND, traces / "cloudPhysicsIO.vscsi", "paper"),
            ("vscsi", REWIND, traces / "cloudPhysicsIO.vscsi", "steady-state"),
            ("csv", REWIND, csv, "paper"),
            ("oracleGeneral (every request a write)", REWIND, traces / "cloudPhysicsIO.oracleGeneral.bin", "paper"),
        ]
        if args.before:
            cases.append(("csv, the earlier binary", Path(args.before), csv, None))
        results = {index: ([], []) for index in range(len(cases))}
        for run in range(args.runs):
            for index, (form, binary, trace, convention) in enumerate(cases):
                seconds, megabytes = measure(binary, trace, convention, scratch / f"report-{index}")
                results[index][0].append(seconds)
                results[index][1].append(megabytes)
                print(f"run {run} {form:40} {convention or '(before conventions)':14} {seconds:6.2f} s "
                      f"{megabytes:6.1f} MB", flush=True)
    env = environment()
    lines = [
        "<!-- lab:begin (written by bench/lab.py; do not edit by hand) -->",
        "## The lab on a real trace (issue 16)",
        "",
        f"`python3 bench/lab.py --runs {args.runs}{' --before …' if args.before else ''}` — {env['date']}, "
        f"commit {env['commit']}, {env['cpu']}, {env['memory']}. `rewind lab analyze` of the CloudPhysics VSCSI "
        "trace libCacheSim distributes (113,872 requests, 66,898 writes; `scripts/fetch-traces.sh`) at the "
        "default granularities (ew, 1s, 10s, 1m, 5m, 30m, 60m) and caches (64MiB, 256MiB, 4GiB): 21 replays of "
        "all six layouts and the report. Wall-clock seconds and peak resident memory (wait4's ru_maxrss), min / "
        "median / max over the runs. The issue measured 20 s and 59 MB before this change; with `--before`, a "
        "binary of an earlier commit analyses the csv form in the same runs, and the ratios are to it, run by run.",
        "",
    ]
    before = len(cases) - 1 if args.before else None
    if before is None:
        lines += ["| trace form | convention | seconds | peak MB |", "|---|---|---:|---:|"]
    else:
        lines += ["| trace form | convention | seconds | peak MB | seconds ÷ earlier binary | MB ÷ earlier binary |",
                  "|---|---|---:|---:|---:|---:|"]
    for index, (form, _, _, convention) in enumerate(cases):
        seconds, megabytes = results[index]
        row = f"| {form} | {convention or 'before conventions'} | {spread(seconds, 1)} | {spread(megabytes, 0)} |"
        if before is not None:
            ratio = lambda values, base: spread([value / other for value, other in zip(values, base)])
            row += f" {ratio(seconds, results[before][0])} | {ratio(megabytes, results[before][1])} |"
        lines.append(row)
    lines.append("<!-- lab:end -->")
    publish("lab", lines)


if __name__ == "__main__":
    main()
