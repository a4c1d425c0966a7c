#!/usr/bin/env python3
"""What vouch records cost (issue 11, req 5).

Once a volume's journal has been quiet for `--journal-vouch-after` (100 ms)
after a commit, Rewind appends and commits a 64-byte vouch record, so that
damage to the last acknowledged writes is told from a torn write after a
crash. The cost is one small write and one fdatasync per quiet spell, on the
maintenance thread — never on a request's path, but it can delay the next
commit by a sync if a request arrives just then.

Two servers from the same binary, side by side in one run, the vouch on and
off (`--journal-vouch-after 0s`); the same fio jobs against each, in
alternating order:

- bursts: 8 random 4 KiB writes and a flush, then 300 ms of nothing (fio
  thinktime): a vouch after every burst — the worst case;
- steady: random 4 KiB writes, queue depth 32, a flush every 8 writes: no
  quiet spell, no vouch.

Reports, as ratios on ÷ off (min / median / max over the runs): the
median and 99th percentile latency of writes and flushes in bursts, and
steady throughput; and the journal syncs each server made per burst.

Usage: python3 bench/vouch.py [--runs 3] [--runtime 15]
"""

import argparse
import os
import shutil
import statistics
from pathlib import Path

from benchlib import REWIND, Process, api, environment, fio, remember_token, wait_port, write_section

JOBS = {
    "bursts": ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=8", "--thinktime=300ms", "--thinktime_blocks=8"],
    "steady": ["--rw=randwrite", "--bs=4k", "--iodepth=32", "--fsync=8"],
}


def percentile(job, kind, key, point):
    values = job[kind][key]["percentile"]
    return values[min(values, key=lambda name: abs(float(name) - point))] / 1e6


def run_once(args, index, results):
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    servers = []
    targets = {}
    try:
        for name, nbd_port, http_port, vouch in [("on", 10931, 10932, "100ms"), ("off", 10933, 10934, "0s")]:
            data = work / name
            process = Process(
                [str(REWIND), "serve", "--data-dir", str(data), "--nbd", f"127.0.0.1:{nbd_port}",
                 "--http", f"127.0.0.1:{http_port}", "--journal-vouch-after", vouch],
                ready_pattern=[r"listening http"],
                env={**os.environ, "RUST_LOG": "warn"},
            )
            servers.append(process)
            wait_port(nbd_port)
            http = f"127.0.0.1:{http_port}"
            remember_token(http, data)
            api(http, "POST", "/v1/volumes", {"name": "bench", "size_bytes": 256 << 20})
            targets[name] = (f"nbd://127.0.0.1:{nbd_port}/bench", http)
        order = ["on", "off"] if index % 2 == 0 else ["off", "on"]
        for job_name, job_args in JOBS.items():
            for target in order:
                uri, http = targets[target]
                syncs_before = api(http, "GET", "/v1/volumes/bench/stats")["io"]["journal"]["syncs"]
                job = fio(uri, job_name, job_args, "256M", runtime=args.runtime)
                syncs = api(http, "GET", "/v1/volumes/bench/stats")["io"]["journal"]["syncs"] - syncs_before
                row = results.setdefault(job_name, {}).setdefault(target, [])
                bursts = max(job["write"]["total_ios"] // 8, 1)
                row.append({
                    "write_p50": percentile(job, "write", "clat_ns", 50.0),
                    "write_p99": percentile(job, "write", "clat_ns", 99.0),
                    "sync_p50": percentile(job, "sync", "lat_ns", 50.0) if job["sync"]["total_ios"] else 0,
                    "sync_p99": percentile(job, "sync", "lat_ns", 99.0) if job["sync"]["total_ios"] else 0,
                    "iops": job["write"]["iops"],
                    "syncs_per_burst": syncs / bursts,
                })
                print(f"run {index} {job_name:7} vouch {target:3}: {job['write']['iops']:9.0f} IOPS, "
                      f"write p50 {row[-1]['write_p50']:.3f} ms p99 {row[-1]['write_p99']:.3f} ms, "
                      f"journal syncs per 8 writes {row[-1]['syncs_per_burst']:.2f}", flush=True)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def spread(values):
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def table(results, env, args):
    lines = [
        "<!-- vouch:begin (written by bench/vouch.py; do not edit by hand) -->",
        "## What vouch records cost",
        "",
        f"`python3 bench/vouch.py --runs {args.runs} --runtime {args.runtime}` — {env['date']}, commit "
        f"{env['commit']}, {env['cpu']}, {env['memory']}, {env['fio']}. Two Rewind servers of the same build side "
        "by side, the vouch record on (`--journal-vouch-after 100ms`, the default) and off (`0s`), the same fio "
        "job against each in alternating order. Ratios on ÷ off, min / median / max over the runs (below 1 is "
        "faster or fewer with vouching on).",
        "",
        "| job | measure | on ÷ off | on (median) | off (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for job, measures in [
        ("bursts", ["write_p50", "write_p99", "sync_p50", "sync_p99", "syncs_per_burst"]),
        ("steady", ["iops", "write_p99", "syncs_per_burst"]),
    ]:
        for measure in measures:
            on = [run[measure] for run in results[job]["on"]]
            off = [run[measure] for run in results[job]["off"]]
            ratios = [a / b for a, b in zip(on, off) if b]
            unit = "" if measure in ("iops", "syncs_per_burst") else " ms"
            lines.append(
                f"| {job} | {measure} | {spread(ratios) if ratios else '—'} | "
                f"{statistics.median(on):.3f}{unit} | {statistics.median(off):.3f}{unit} |"
            )
    def extra_syncs(job):
        on, off = (statistics.median(run["syncs_per_burst"] for run in results[job][side]) for side in ("on", "off"))
        return on - off

    lines += [
        "",
        f"Journal syncs per burst of 8 writes, on minus off (medians): {extra_syncs('bursts'):+.2f} in bursts, "
        f"where each quiet spell is vouched for by a sync on the maintenance thread, off any request's path; "
        f"{extra_syncs('steady'):+.2f} under steady load, which has no quiet spell to vouch for.",
        "<!-- vouch:end -->",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--runtime", type=int, default=15)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-vouch")
    args = parser.parse_args()
    results = {}
    for index in range(args.runs):
        run_once(args, index, results)
    section = table(results, environment(), args)
    print(section)
    write_section("vouch", section)


if __name__ == "__main__":
    main()
