#!/usr/bin/env python3
"""A SPECsfs-like NFSv3 load (bench/trees `nfs-mix`: the SPECsfs 3.0
operation mix with the update share scaled to 12, 36, 60 and 96%) against:

- nfs-ganesha alone (VFS FSAL on a directory of the same filesystem): the
  vanilla server, the baseline;
- Rewind's own NFS server (`rewind serve`, UCDP-I);
- `rewind proxy` in front of that nfs-ganesha (UCDP-O), and with `--async`
  (UCDP-A);
- `tcp-relay` (bench/trees) relaying the NFS and MOUNT ports to that
  nfs-ganesha and doing nothing else: the floor for any proxy in user space
  on this machine (a second TCP hop, a read and a write per message each
  way), which the proxies' figures are also read against;
- fio's random 8 KiB reads and writes at the same write share, `--direct=1`
  on the same filesystem: the device's own limit.

Throughput, mean and p99 latency, and CPU per operation (the servers'
user + system time over the run, from /proc, divided by the operations; for
a proxy, its own and ganesha's). Then the data directory's bytes per byte
the clients wrote (history with deduplication and compression, journal
included). Writes the "nfs-mix" section of BENCHMARKS.md.

Needs root (nfs-ganesha, rpcbind), `apt install nfs-ganesha nfs-ganesha-vfs
rpcbind fio`, and `cargo build --release -p rewind-cli -p rewind-bench-trees`.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

from benchlib import (ROOT, REWIND, Process, api, environment, fio, publish, remember_token, spread, start_ganesha,
                      start_server, stop_ganesha, wait_port)

NFS_MIX = ROOT / "target" / "release" / "nfs-mix"
TCP_RELAY = ROOT / "target" / "release" / "tcp-relay"
WORK = Path("/var/tmp/rewind-bench-nfs-mix")
NBD, HTTP, NFS = 11940, 11941, 11942
GANESHA_NFS, GANESHA_MOUNT = 20501, 20502
RELAY_MOUNT = 11943
MIXES = (12, 36, 60, 96)
CONFIGS = ("ganesha", "rewind", "relay", "proxy", "proxy-async")
PROXIES = ("relay", "proxy", "proxy-async")
TICKS = os.sysconf("SC_CLK_TCK")



def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def du(path):
    return int(subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True, text=True).stdout.split()[0])


def run_config(config, args):
    """All mixes on one configuration, fresh servers: {mix: result}, data bytes, bytes written."""
    work = WORK / config
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # What the configuration before left dirty is written out first: an
    # fsync on ext4 commits its journal, which waits for every dirty page
    # of the filesystem, and nfs-ganesha's COMMITs took 0.6, 1.6 and 4.2 ms
    # in a run's three turns as the other configurations' data piled up.
    os.sync()
    servers, ganesha, data = [], None, None
    if config != "rewind":
        ganesha, export = start_ganesha(work / "ganesha", GANESHA_NFS, GANESHA_MOUNT)
        servers.append(("ganesha", ganesha.pid))
    if config == "ganesha":
        target = (GANESHA_NFS, GANESHA_MOUNT, str(export))
    elif config == "relay":
        relay = subprocess.Popen(
            [str(TCP_RELAY), "--listen", f"127.0.0.1:{NFS}", "--upstream", f"127.0.0.1:{GANESHA_NFS}",
             "--listen", f"127.0.0.1:{RELAY_MOUNT}", "--upstream", f"127.0.0.1:{GANESHA_MOUNT}"],
        )
        wait_port(NFS)
        servers.append(("rewind", relay.pid))
        target = (NFS, RELAY_MOUNT, str(export))
    elif config == "rewind":
        _, data, server = start_server(work / "rewind", NBD, HTTP, options=["--nfs", f"127.0.0.1:{NFS}"])
        remember_token(f"127.0.0.1:{HTTP}", data)
        api(f"127.0.0.1:{HTTP}", "POST", "/v1/volumes", {"name": "home", "size_bytes": 0, "tree": True})
        servers.append(("rewind", server.process.pid))
        target = (NFS, NFS, "/home")
    else:
        data = work / "proxy" / "data"
        server = Process(
            [str(REWIND), "proxy", "--data-dir", str(data), "--upstream", f"127.0.0.1:{GANESHA_NFS}",
             "--upstream-mount-port", str(GANESHA_MOUNT), "--tree", "shop", "--nfs", f"127.0.0.1:{NFS}",
             "--nbd", f"127.0.0.1:{NBD}", "--http", f"127.0.0.1:{HTTP}",
             *(["--async"] if config == "proxy-async" else [])],
            ready_pattern=[r"listening http"], env={**os.environ, "RUST_LOG": "warn"},
        )
        servers.append(("rewind", server.process.pid))
        target = (NFS, NFS, "/shop")
    results, written = {}, 0
    try:
        for mix in MIXES:
            before = {name: cpu_seconds(pid) for name, pid in servers}
            output = subprocess.run(
                [str(NFS_MIX), "--nfs-port", str(target[0]), "--mount-port", str(target[1]), "--export", target[2],
                 "--dir", f"mix{mix}", "--updates", str(mix), "--seconds", str(args.seconds),
                 "--clients", str(args.clients)],
                check=True, capture_output=True, text=True, timeout=600,
            ).stdout
            result = json.loads(output)
            for name, pid in servers:
                result[f"{name}_cpu_us_per_op"] = (cpu_seconds(pid) - before[name]) * 1e6 / result["ops"]
            written += result["bytes_written"]
            results[mix] = result
            print(f"{config} {mix}%: {result}", flush=True)
    finally:
        if config == "relay":
            relay.terminate()
            relay.wait(timeout=30)
        elif config != "ganesha":
            server.stop()
        if ganesha:
            stop_ganesha(ganesha)
    return results, (du(data) if data else None), written


def device_limit(args):
    """fio random 8 KiB at each write share, direct I/O on the same filesystem."""
    path = WORK / "fio.bin"
    limits = {}
    for mix in MIXES:
        job = fio(str(path), f"mix{mix}", ["--rw=randrw", f"--rwmixwrite={mix}", "--bs=8k",
                                         f"--iodepth={args.clients}"], "256M", runtime=args.seconds)
        limits[mix] = job["read"]["iops"] + job["write"]["iops"]
    path.unlink()
    return limits


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    env = environment()
    runs = {config: [] for config in CONFIGS}
    space = {config: [] for config in CONFIGS}
    devices = []
    for run in range(args.runs):
        WORK.mkdir(parents=True, exist_ok=True)
        devices.append(device_limit(args))
        # In turn, so drift in the machine falls on all of them.
        for config in CONFIGS:
            results, data_bytes, written = run_config(config, args)
            runs[config].append(results)
            if data_bytes is not None:
                space[config].append(data_bytes / written)
    shutil.rmtree(WORK, ignore_errors=True)

    def values(config, mix, key):
        return [results[mix][key] for results in runs[config]]

    def ratio(config, mix, key):
        return [a / b for a, b in zip(values(config, mix, key), values("ganesha", mix, key))]

    lines = [
        "<!-- nfs-mix:begin (written by bench/nfs_mix.py; do not edit by hand) -->",
        "## File trees over NFS: a SPECsfs-like mix against nfs-ganesha (issue 15)",
        "",
        f"`python3 bench/nfs_mix.py --runs {args.runs} --seconds {args.seconds} --clients {args.clients}` —"
        f" {env['date']}, commit {env['commit']}, {env['cpu']}, {env['memory']}. `nfs-mix` (bench/trees):"
        f" {args.clients} clients, one request at a time each, the SPECsfs 3.0 NFSv3 mix with its updates"
        " (WRITE, COMMIT, CREATE, REMOVE, SETATTR) scaled to the share shown and the rest (LOOKUP, READ, GETATTR,"
        " READDIRPLUS, READLINK, ACCESS, READDIR, FSSTAT) to what is left, 8 KiB I/O on a working set of 64"
        " files of 128 KiB per client, for"
        f" {args.seconds} s per mix. nfs-ganesha is the VFS FSAL on a directory of the same filesystem; the"
        " proxies and `tcp-relay` (bench/trees: relaying its NFS and MOUNT ports, bytes only, a thread per direction:"
        " the floor for any proxy in user space) sit in front of it; every configuration starts fresh, in turn. Min / median / max of"
        f" {args.runs} runs; ratios are to nfs-ganesha in the same run. CPU per operation is user + system"
        " time of the server processes over the run (2 cores shared with the clients).",
        "",
        "| update share | nfs-ganesha ops/s | Rewind server ÷ ganesha | relay ÷ ganesha | proxy ÷ ganesha"
        " | proxy --async ÷ ganesha | proxy ÷ relay | device limit (fio 8 KiB randrw, direct) IOPS |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mix in MIXES:
        device = [limits[mix] for limits in devices]
        over_relay = [a / b for a, b in zip(values("proxy", mix, "ops_per_s"), values("relay", mix, "ops_per_s"))]
        lines.append(
            f"| {mix}% | {spread(values('ganesha', mix, 'ops_per_s'), 0)} | "
            + " | ".join(spread(ratio(config, mix, "ops_per_s")) for config in ("rewind", *PROXIES))
            + f" | {spread(over_relay)} | {spread(device, 0)} |"
        )
    lines += [
        "",
        "Latency, mean and p99 in µs (medians of the runs):",
        "",
        "| update share | ganesha mean / p99 | Rewind server | relay | proxy | proxy --async |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for mix in MIXES:
        cells = [
            f"{statistics.median(values(config, mix, 'mean_us')):.0f} / {statistics.median(values(config, mix, 'p99_us')):.0f}"
            for config in CONFIGS
        ]
        lines.append(f"| {mix}% | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CPU per operation in µs (medians): the Rewind process (tcp-relay's for the relay), and nfs-ganesha's behind"
        " a proxy:",
        "",
        "| update share | ganesha alone | Rewind server | relay (+ its ganesha) | proxy (+ its ganesha)"
        " | proxy --async (+ its ganesha) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for mix in MIXES:
        def cpu(config, name):
            return statistics.median(values(config, mix, f"{name}_cpu_us_per_op"))
        lines.append(
            f"| {mix}% | {cpu('ganesha', 'ganesha'):.0f} | {cpu('rewind', 'rewind'):.0f} | "
            + " | ".join(f"{cpu(config, 'rewind'):.0f} (+ {cpu(config, 'ganesha'):.0f})" for config in PROXIES)
            + " |"
        )
    # Which operations the time goes to where updates are most of the mix.
    busiest = MIXES[-1]
    operations = sorted({op for config in CONFIGS for results in runs[config] for op in results[busiest]["by_operation"]})
    lines += [
        "",
        f"Mean latency in µs by operation at {busiest}% updates (medians of the runs), and each operation's share of"
        " the calls (in the SPECsfs mix CREATE writes the new file's first 8 KiB too):",
        "",
        "| operation | share | ganesha | Rewind server | relay | proxy | proxy --async |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op in operations:
        def op_mean(config):
            means = [results[busiest]["by_operation"][op]["mean_us"] for results in runs[config]
                     if op in results[busiest]["by_operation"]]
            return f"{statistics.median(means):.0f}" if means else "–"
        calls = [results[busiest]["by_operation"].get(op, {}).get("count", 0) / results[busiest]["ops"]
                 for results in runs["ganesha"]]
        lines.append(f"| {op.upper()} | {statistics.median(calls):.1%} | "
                     + " | ".join(op_mean(config) for config in CONFIGS) + " |")
    lines += [
        "",
        "Space: the data directory's bytes (journal, index, chunk store) per byte the clients wrote, after all four"
        " mixes: "
        + ", ".join(f"{config} {spread(space[config])}" for config in ("rewind", "proxy", "proxy-async"))
        + " (the proxies' mirrors also hold their copy of the upstream's files).",
        "<!-- nfs-mix:end -->",
    ]
    publish("nfs-mix", lines)


if __name__ == "__main__":
    main()
