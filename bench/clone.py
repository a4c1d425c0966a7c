#!/usr/bin/env python3
"""A clone against a plain volume (issue 12, req 3: ≥ 0.9× a plain volume).

One Rewind server, two 1 GiB volumes filled with the same fio sequential
write of random data: `plain`, and `base`, cloned at once as `clone` (which
has written nothing yet: every read of it goes through to the base). Per
run, in alternating order, the same fio jobs against `plain` and `clone`:
4 KiB random reads at queue depth 32, then 4 KiB random writes at queue
depth 32 with a flush every 64 (after which the clone's written blocks are
its own). Reports IOPS clone ÷ plain (min / median / max over the runs).

Usage: python3 bench/clone.py [--runs 3] [--runtime 10]
"""

import argparse
import shutil

from benchlib import api, environment, fio, remember_token, spread, start_server, wait_port, write_section

NBD, HTTP = 10951, 10952
JOBS = {
    "randread": ["--rw=randread", "--bs=4k", "--iodepth=32"],
    "randwrite": ["--rw=randwrite", "--bs=4k", "--iodepth=32", "--fsync=64"],
}



def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--runtime", type=int, default=10)
    parser.add_argument("--dir", default="/var/tmp/rewind-bench-clone")
    args = parser.parse_args()
    work, data, server = start_server(args.dir, NBD, HTTP)
    iops = {job: {"plain": [], "clone": []} for job in JOBS}
    try:
        wait_port(NBD)
        http = f"127.0.0.1:{HTTP}"
        remember_token(http, data)
        for name in ["plain", "base"]:
            api(http, "POST", "/v1/volumes", {"name": name, "size_bytes": 1 << 30})
            fio(f"nbd://127.0.0.1:{NBD}/{name}", "fill", ["--rw=write", "--bs=1M", "--iodepth=8"], "1G")
        api(http, "POST", "/v1/volumes/base/clones", {"name": "clone"})
        for index in range(args.runs):
            order = ["plain", "clone"] if index % 2 == 0 else ["clone", "plain"]
            for job, job_args in JOBS.items():
                for volume in order:
                    result = fio(f"nbd://127.0.0.1:{NBD}/{volume}", job, job_args, "1G", runtime=args.runtime)
                    direction = "read" if job == "randread" else "write"
                    iops[job][volume].append(result[direction]["iops"])
                    print(f"run {index} {job:9} {volume:5}: {result[direction]['iops']:9.0f} IOPS", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    env = environment()
    lines = [
        "<!-- clone:begin (written by bench/clone.py; do not edit by hand) -->",
        "## A clone against a plain volume (issue 12)",
        "",
        f"`python3 bench/clone.py --runs {args.runs} --runtime {args.runtime}` — {env['date']}, commit "
        f"{env['commit']}, {env['cpu']}, {env['memory']}, {env['fio']}. Two 1 GiB volumes filled alike, one "
        "cloned at once; fio over NBD against the plain volume and the clone in alternating order (the clone's "
        "reads go through to its base until it writes the block). IOPS, min / median / max over the runs.",
        "",
        "| job | plain | clone | clone ÷ plain |",
        "|---|---:|---:|---:|",
    ]
    for job in JOBS:
        plain, clone = iops[job]["plain"], iops[job]["clone"]
        ratios = [c / p for c, p in zip(clone, plain)]
        lines.append(f"| {job} 4 KiB, QD 32 | {spread(plain, 0)} | {spread(clone, 0)} | {spread(ratios)} |")
    lines.append("<!-- clone:end -->")
    section = "\n".join(lines)
    print(section)
    write_section("clone", section)


if __name__ == "__main__":
    main()
