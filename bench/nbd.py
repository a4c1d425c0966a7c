#!/usr/bin/env python3
"""Block I/O benchmark: the same fio jobs over NBD against Rewind and against
`nbdkit file` on the same disk, side by side in one run, interleaved job by job.

Writes a table of throughput ratios (Rewind / nbdkit file; min, median and max
over the runs) into BENCHMARKS.md between the `nbd` markers, beside the
device's own limit: the same jobs by fio on a file of the same filesystem
with direct I/O (libaio), measured in the same run. Not a test: no
thresholds fail it, it reports.

    python3 bench/nbd.py --runs 3 --size 1G --runtime 15 --core 41e2a30

Every-write history is on in Rewind (it is always on), and so is archiving
into the deduplicated, compressed chunk store (every 5 s here, so that it
runs during the jobs). With `--core REV`, the Rewind of that revision (before
the chunk store) runs as a third server in the same run, built once into a
git worktree beside the repository.

The view rows read a view at a bookmark taken before a random overwrite,
after every job's history, against the live volume: its history as the
server keeps it by itself (it lays a bookmark's history out in block order
in the background once it is archived, unless `--no-bookmark-layout`);
the last two read it again after `rewind volume defrag`, which then finds
what is left to lay out.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import REWIND, ROOT, Process, api, remember_token, drop_caches, environment, fio, throughput, wait_port, write_section

# name, fio arguments, what is measured, target ratio (from BRIEF.md): to
# nbdkit file, except for sequential writes (below).
JOBS = [
    ("seqwrite-1m", ["--rw=write", "--bs=1m", "--iodepth=4"], "write", 0.8),
    ("randwrite-4k-qd1", ["--rw=randwrite", "--bs=4k", "--iodepth=1"], "write", 0.9),
    ("randwrite-4k-qd32", ["--rw=randwrite", "--bs=4k", "--iodepth=32"], "write", 0.9),
    ("randwrite-4k-flush8", ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=8"], "write", 1.0),
    ("randread-4k-qd32", ["--rw=randread", "--bs=4k", "--iodepth=32"], "read", 0.9),
    ("seqread-1m", ["--rw=read", "--bs=1m", "--iodepth=4"], "read", 0.9),
    # After `overwrite` below has rewritten every block with random 4 KiB writes.
    ("seqread-1m-after-overwrite", ["--rw=read", "--bs=1m", "--iodepth=4"], "read", 0.9),
]


# Not run back to back: after the first pass it is the same job as seqread-1m.
BACK_TO_BACK_SKIPS = {"seqread-1m-after-overwrite"}

# Jobs whose bound is the device's own direct write with fdatasync, not
# nbdkit file (BRIEF.md: nbdkit only fills the page cache, so keeping every
# byte once is bounded by the disk), with the fio arguments that add the
# syncs to the device's job: every 4 MiB, as the journal benchmark does.
# These jobs run twice, each after the servers are brought to rest. The
# first is a fresh server's first burst beyond the fill: its journal keeps
# spare segment files (written blocks) for a burst the size of the fill
# only, so most of it lands in new files. The second finds spares for a
# burst its size, as the device job finds the blocks of a file written
# before: that one is held to the bound, and the first to the same job into
# a new file (below).
DEVICE_SYNC_BOUND = {"seqwrite-1m": ["--fdatasync=4"]}

# The same bound into a new file: one pass of this size (a time-based job
# would loop over blocks it has written), allocated as a journal segment is
# (`fallocate` keeping the size). ext4 converts the unwritten blocks each
# write lands in, and this disk takes about three quarters of its
# written-block speed there (BENCHMARKS.md): a server's first burst larger
# than its journal's spare segment files writes into such blocks.
DEVICE_NEW_FILE_BYTES = 4 << 30


def nbdinfo_seconds(uri, repeat=15):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(["nbdinfo", "--size", uri], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Every write's history is kept for the whole run: the 2026-11-30 runs of
# 10 s per job left 22-26 GiB of packs each, so about 2.5 GiB per second of
# --runtime on a disk that takes 1 GB/s, held until the run's end. One run
# that found 50 GB free ended with a full disk in its back-to-back writes.
# On 2026-12-04, with Rewind writing 1.5 GB/s, runs of --runtime 10 and of
# --runtime 6 each passed the check then (4 GiB per second) with 56 GB free,
# and each filled the disk in its first run's back-to-back writes: the
# journal holds a burst's history until the archiver, waiting out the
# burst, has copied it into packs, so history takes up to twice its size.
# Since 2026-12-05 the 1 MiB write job runs twice at rest (below): a fifth more.
HISTORY_BYTES_PER_RUNTIME_SECOND = 12 << 30


def check_free_space(args):
    """Refuses to start a run the disk cannot hold, rather than fail in the
    middle of it with write errors."""
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    need = HISTORY_BYTES_PER_RUNTIME_SECOND * args.runtime + 3 * parse_size(args.size) + DEVICE_NEW_FILE_BYTES
    free = shutil.disk_usage(directory).free
    if free < need:
        sys.exit(f"{directory} has {free / 2**30:.0f} GiB free; a run of --runtime {args.runtime} keeps about "
                 f"{need / 2**30:.0f} GiB of history and files until its end: free some, use a shorter "
                 "--runtime, or --dir on a larger filesystem")


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)




def settle(https, view_results):
    """Brings the servers to rest before a job, so that no job pays for the
    previous one's deferred work: `sync` makes the kernel write back the dirty
    pages (nbdkit's writes live there), Rewind's destager catches up with the
    journal, and its archiver with the history (servers without a chunk store
    report no `versions_in_journal`), and lays out the bookmarks' history
    (`bookmarks_awaiting_layout`); its journal gives back the segments that
    hold only archived history (`journal_bytes_reclaimable`, at a
    checkpoint) and writes the spare segment files it keeps for the next
    burst in place of those the chunk store adopted (`journal_spares_owed`).
    Records how long that took."""
    start = time.perf_counter()
    subprocess.run(["sync"], check=True)
    for http in https:
        while True:
            stats = api(http, "GET", "/v1/volumes/bench")["stats"]
            awaiting = (stats.get("versions_in_journal", 0) + stats.get("bookmarks_awaiting_layout", 0)
                        + stats.get("journal_bytes_reclaimable", 0) + stats.get("journal_spares_owed", 0))
            if stats["versions_pending_destage"] == 0 and awaiting == 0:
                break
            time.sleep(0.05)
    view_results.setdefault("settle", []).append(time.perf_counter() - start)


def build_core(revision):
    """Builds `rewind` at `revision` in a worktree beside the repository."""
    tree = ROOT.parent / f"rewind-core-{revision}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision], check=True)
    subprocess.run(["cargo", "build", "--release", "-p", "rewind-cli"], cwd=tree, check=True)
    return tree / "target" / "release" / "rewind"


def run_once(args, run_index, results, view_results):
    size = parse_size(args.size)
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # Baseline: nbdkit's file plugin on a file on the same disk.
    base_file = work / "nbdkit.img"
    device_file = work / "device.img"
    for path in [base_file, device_file]:
        with open(path, "wb") as f:
            f.truncate(size)
    base_port, rewind_port, http_port, core_port, core_http_port = 10900, 10901, 10902, 10903, 10904
    nbdkit = Process(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(base_port), "file", str(base_file)])
    wait_port(base_port)
    servers = [nbdkit]

    def start_rewind(binary, data, nbd_port, api_port, options=()):
        process = Process(
            [str(binary), "serve", "--data-dir", str(work / data), "--nbd", f"127.0.0.1:{nbd_port}",
             "--http", f"127.0.0.1:{api_port}", *options],
            ready_pattern=[r"listening http"],
            env={**os.environ, "RUST_LOG": "warn"},
        )
        servers.append(process)
        http = f"127.0.0.1:{api_port}"
        remember_token(http, work / data)
        api(http, "POST", "/v1/volumes", {"name": "bench", "size_bytes": size})
        return http

    http = start_rewind(REWIND, "rewind", rewind_port, http_port, ["--archive-interval", "5s"])
    https = [http]
    targets = {"nbdkit": f"nbd://127.0.0.1:{base_port}/", "rewind": f"nbd://127.0.0.1:{rewind_port}/bench",
               "device": str(device_file)}
    if args.core_binary:
        https.append(start_rewind(args.core_binary, "core", core_port, core_http_port))
        targets["core"] = f"nbd://127.0.0.1:{core_port}/bench"
    order = list(targets) if run_index % 2 == 0 else list(reversed(targets))
    try:
        # Unmeasured fill, so reads read data.
        for target in order:
            fio(targets[target], "fill", ["--rw=write", "--bs=1m", "--iodepth=4"], size)
        for name, job_args, direction, _target in JOBS:
            if name == "seqread-1m-after-overwrite":
                bookmark = api(http, "POST", "/v1/volumes/bench/bookmarks", {"name": f"before-overwrite-{run_index}"})
                for target in [t for t in order if t != "device"]:
                    # Every block rewritten once, in random order (fio's random map).
                    fio(targets[target], "overwrite", ["--rw=randwrite", "--bs=4k", "--iodepth=32"], size)
            for target in order:
                if target == "device" and name in BACK_TO_BACK_SKIPS:
                    continue
                keys = [f"{target} first", target] if name in DEVICE_SYNC_BOUND else [target]
                for key in keys:
                    settle(https, view_results)
                    job = fio(targets[target], name, job_args, size, runtime=args.runtime)
                    results.setdefault(name, {}).setdefault(key, []).append(throughput(job, direction))
                    note_stolen(view_results, job, run_index, name, target)
                    print(f"run {run_index} {name:28} {key:13} {throughput(job, direction) / 2**20:10.1f} MiB/s "
                          f"({job['stolen_share']:.0%} stolen)", flush=True)
                if target == "device" and name in DEVICE_SYNC_BOUND:
                    job = fio(targets[target], name, job_args, size, runtime=args.runtime,
                              extra=DEVICE_SYNC_BOUND[name])
                    results[name].setdefault("device-sync", []).append(throughput(job, direction))
                    print(f"run {run_index} {name:28} device with fdatasync "
                          f"{throughput(job, direction) / 2**20:10.1f} MiB/s", flush=True)
                    new_file = work / "device-new.img"
                    try:
                        job = fio(str(new_file), name, job_args, DEVICE_NEW_FILE_BYTES,
                                  extra=[*DEVICE_SYNC_BOUND[name], "--fallocate=keep"])
                    finally:
                        new_file.unlink(missing_ok=True)
                    results[name].setdefault("device-new", []).append(throughput(job, direction))
                    print(f"run {run_index} {name:28} device with fdatasync, a new file "
                          f"{throughput(job, direction) / 2**20:10.1f} MiB/s", flush=True)
        # A view at a time before the overwrite, against the live volume now.
        view_uri = f"nbd://127.0.0.1:{rewind_port}/bench@{bookmark['at']}"
        settle(https, view_results)
        live = fio(targets["rewind"], "live-read", ["--rw=read", "--bs=1m", "--iodepth=4"], size, runtime=args.runtime)
        settle(https, view_results)
        old = fio(view_uri, "view-read", ["--rw=read", "--bs=1m", "--iodepth=4", "--readonly"], size,
                  runtime=args.runtime)
        view_results.setdefault("seqread", []).append(throughput(old, "read") / throughput(live, "read"))
        # The live read comes from the page cache; the view's packs were
        # written behind and left it, so the device bounds the view.
        device_read = results["seqread-1m"]["device"][-1]
        view_results.setdefault("seqread_device", []).append(throughput(old, "read") / device_read)
        print(f"run {run_index} view read at T before overwrite: {throughput(old, 'read') / 2**20:.1f} MiB/s, "
              f"live {throughput(live, 'read') / 2**20:.1f} MiB/s", flush=True)
        # The jobs again, back to back: each server brought to rest once, then
        # every job right after the one before, whatever work that left.
        for target in [t for t in order if t not in ("core", "device")]:
            settle(https, view_results)
            for name, job_args, direction, _target in JOBS:
                if name in BACK_TO_BACK_SKIPS:
                    continue
                collections = api(http, "GET", "/v1/stats")["collections"] if target == "rewind" else 0
                job = fio(targets[target], name, job_args, size, runtime=args.runtime)
                results.setdefault(f"{name} b2b", {}).setdefault(target, []).append(throughput(job, direction))
                note_stolen(view_results, job, run_index, f"{name} back to back", target)
                if target == "rewind":
                    collections = api(http, "GET", "/v1/stats")["collections"] - collections
                print(f"run {run_index} {name:28} {target:7} {throughput(job, direction) / 2**20:10.1f} MiB/s "
                      f"back to back ({job['stolen_share']:.0%} stolen, {collections} collections)", flush=True)
        # The view against the live volume like with like, after the jobs
        # back to back (so that dropping the page cache changes none of
        # them): each read once, then each again (from the page cache, the
        # second reads taken); then both from the disk, the page cache
        # dropped before each (Rewind's own caches are not).
        # Then the view's history laid out in block order (`rewind volume
        # defrag`), and the same pairs again.
        for phase in ["", "defrag_"]:
            if phase:
                defrag = subprocess.run([str(REWIND), "--server", f"http://{http}", "--data-dir",
                                         str(work / "rewind"), "volume", "defrag", f"bench@{bookmark['at']}", "--json"],
                                        check=True, capture_output=True, text=True)
                view_results.setdefault("defrag_moved", []).append(json.loads(defrag.stdout)["chunks_moved"])
            settle(https, view_results)
            reads = {}
            for key, uri, drop in [("live", targets["rewind"], False), ("view", view_uri, False),
                                   ("live warm", targets["rewind"], False), ("view warm", view_uri, False),
                                   ("live cold", targets["rewind"], True), ("view cold", view_uri, True)]:
                if drop:
                    drop_caches()
                # From the disk, one pass: time-based, it would go round again
                # from the page cache.
                job = fio(uri, key.replace(" ", "-"), ["--rw=read", "--bs=1m", "--iodepth=4", "--readonly"], size,
                          runtime=None if drop else args.runtime)
                reads[key] = throughput(job, "read")
            for kind in ["warm", "cold"]:
                view_results.setdefault(f"seqread_{phase}{kind}", []).append(
                    reads[f"view {kind}"] / reads[f"live {kind}"])
            print(f"run {run_index} {phase}view ÷ live read, page cache warm: {reads['view warm'] / 2**20:.1f} ÷ "
                  f"{reads['live warm'] / 2**20:.1f} MiB/s; cold: {reads['view cold'] / 2**20:.1f} ÷ "
                  f"{reads['live cold'] / 2**20:.1f} MiB/s", flush=True)
        oldest = f"nbd://127.0.0.1:{rewind_port}/bench@{api(http, 'GET', '/v1/volumes/bench')['created']}"
        open_live = nbdinfo_seconds(targets["rewind"])
        open_view = nbdinfo_seconds(oldest)
        open_base = nbdinfo_seconds(targets["nbdkit"])
        view_results.setdefault("open", []).append((open_view, open_live, open_base))
        stats = api(http, "GET", "/v1/volumes/bench")["stats"]
        view_results.setdefault("layout_bytes", []).append(stats.get("layout_bytes_written", 0))
        view_results.setdefault("versions", []).append(stats["versions"])
        view_results.setdefault("archived", []).append(stats["versions_archived"])
        node = api(http, "GET", "/v1/stats")
        view_results.setdefault("chunks", []).append(node)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def note_stolen(view_results, job, run_index, name, target):
    """Keeps the share of CPU time the hypervisor took during `job` (see
    `benchlib.fio`), with which job it was."""
    view_results.setdefault("stolen", []).append((job["stolen_share"], run_index, name, target))


def stolen_text(view_results):
    """A sentence on the CPU time the hypervisor took during the jobs."""
    stolen = view_results["stolen"]
    shares = [share for share, *_ in stolen]
    most, run_index, name, target = max(stolen)
    return (
        "CPU time the hypervisor took from this machine during the jobs (steal in /proc/stat, every server's "
        f"jobs): min / median / max {min(shares):.0%} / {statistics.median(shares):.0%} / {max(shares):.0%}; "
        f"the most during {name} against {target} in run {run_index}. A job that lost much of its CPU measures "
        "the host's other guests as well."
    )


def spread(values, scale=1.0):
    return min(values) * scale, statistics.median(values) * scale, max(values) * scale


def table(args, results, view_results, env):
    lines = [
        "<!-- nbd:begin (written by bench/nbd.py; do not edit by hand) -->",
        "## Block I/O over NBD: Rewind vs `nbdkit file`",
        "",
        f"`python3 bench/nbd.py --runs {args.runs} --size {args.size} --runtime {args.runtime}"
        + (f" --core {args.core}" if args.core else "") + "` on "
        f"{env['date']}, commit {env['commit']}: {env['cpu']}, {env['memory']}, Linux {env['kernel']}, "
        f"{env['fio']}, nbdkit {env['nbdkit']}.",
        "",
        "Each job runs against every server in the same run, interleaved (the order alternates between runs); "
        f"{args.runtime} s per job after a 2 s ramp, volumes and file of {args.size} on the same disk, filled "
        "first. Before each job the servers are brought to rest: `sync` (the kernel writes back nbdkit's dirty "
        "pages), Rewind's destager catches up with the journal and its archiver with the history, its journal "
        "gives back the segments that hold only archived history and writes the spare segment files it keeps for "
        "the next burst in place of those the chunk store adopted (median "
        f"{statistics.median(view_results['settle']):.1f} s, max {max(view_results['settle']):.1f} s, sync included). "
        "Rewind keeps every write's history throughout and archives it into the deduplicated, compressed chunk "
        "store every 5 s, during the jobs. Ratio = Rewind throughput / nbdkit throughput, "
        f"min / median / max over {args.runs} runs."
        + (f" *Core* is Rewind at commit {args.core} (journal and current store, no chunk store), run alongside."
           if args.core_binary else ""),
        "",
        "The device's own limit: the same fio job on a file of the same filesystem with direct I/O (libaio), in "
        "the same run; *÷ device* is each server's throughput over it (medians of the per-run ratios). The "
        "target is a ratio to nbdkit file, except for 1 MiB writes: nbdkit only fills the page cache there, so "
        "the bound for keeping every byte once is the device's direct write with `--fdatasync=4` (a sync every "
        "4 MiB), and the target column gives Rewind ÷ that, min / median / max (BRIEF.md). That job runs twice "
        "at rest. The device job overwrites a file written before, and the second Rewind job is held to it: its "
        "journal writes into the spare segment files it kept, and wrote at rest, for a burst the size of the "
        "first. The first is a fresh server's first burst after the fill, whose journal has spares for the "
        "fill's size only, so it writes mostly into new files: beside it, Rewind ÷ the device's job in one pass "
        f"of {DEVICE_NEW_FILE_BYTES >> 30} GiB into a new file, allocated as a journal segment is. On this disk "
        "blocks not written before take writes slower than written ones whatever writes them (BENCHMARKS.md).",
        "",
        stolen_text(view_results),
        "",
        "| job | device (median) | nbdkit file (median) | Rewind (median) | Rewind ÷ nbdkit min / median / max "
        "| target | | nbdkit ÷ device | Rewind ÷ device min / median / max |"
        + (" core (median) | core ÷ nbdkit (median) | Rewind ÷ core min / median / max |" if args.core_binary else ""),
        "|---|---:|---:|---:|---|---:|---|---:|---|" + ("---:|---:|---|" if args.core_binary else ""),
    ]
    for name, _args, _direction, target in JOBS:
        base = results[name]["nbdkit"]
        ours = results[name]["rewind"]
        ratios = [o / b for o, b in zip(ours, base)]
        low, median, high = spread(ratios)
        sync_bound = results[name].get("device-sync")
        if sync_bound:
            bound_low, bound_median, bound_high = spread([o / d for o, d in zip(ours, sync_bound)])
            first = results[name]["rewind first"]
            first_low, first_median, first_high = spread([o / d for o, d in zip(first, sync_bound)])
            new_file = results[name]["device-new"]
            new_low, new_median, new_high = spread([o / d for o, d in zip(first, new_file)])
            target_text = (f"≥ {target} × the device with fdatasync ({statistics.median(sync_bound) / 2**20:.0f} "
                           f"MiB/s): {bound_low:.2f} / {bound_median:.2f} / {bound_high:.2f}. A fresh server's "
                           f"first burst ({statistics.median(first) / 2**20:.0f} MiB/s): {first_low:.2f} / "
                           f"{first_median:.2f} / {first_high:.2f}; ÷ the same job into a new file "
                           f"({statistics.median(new_file) / 2**20:.0f} MiB/s): "
                           f"{new_low:.2f} / {new_median:.2f} / {new_high:.2f}")
            mark = "met" if bound_median >= target else "**missed**"
        else:
            target_text = f"≥ {target}"
            mark = "met" if median >= target else "**missed**"
        device = results[name].get("device")
        if device:
            device_low, device_median, device_high = spread([o / d for o, d in zip(ours, device)])
            device_cells = (
                f"{statistics.median([b / d for b, d in zip(base, device)]):.2f} | "
                f"{device_low:.2f} / {device_median:.2f} / {device_high:.2f} |"
            )
            device_text = f"{statistics.median(device) / 2**20:.0f} MiB/s"
        else:
            # After the overwrite: a file has no history, so no device figure.
            device_cells, device_text = "– | – |", "–"
        line = (
            f"| {name} | {device_text} | {statistics.median(base) / 2**20:.0f} MiB/s | "
            f"{statistics.median(ours) / 2**20:.0f} MiB/s | "
            f"{low:.2f} / {median:.2f} / {high:.2f} | {target_text} | {mark} | {device_cells}"
        )
        if args.core_binary:
            core = results[name]["core"]
            core_low, core_median, core_high = spread([o / c for o, c in zip(ours, core)])
            line += (
                f" {statistics.median(core) / 2**20:.0f} MiB/s | "
                f"{statistics.median([c / b for c, b in zip(core, base)]):.2f} | "
                f"{core_low:.2f} / {core_median:.2f} / {core_high:.2f} |"
            )
        lines.append(line)
    lines += [
        "",
        "Back to back (issue 13, req 4): after the table above, in the same run, each server is brought to rest "
        "once and then runs the jobs one right after the other, paying for whatever work the job before left "
        "(dirty pages, destaging, archiving). Each server's figure ÷ its own rested figure in the same run.",
        "",
        "| job | Rewind back to back (median) | Rewind back to back ÷ rested, min / median / max | target | | "
        "nbdkit back to back ÷ rested (median) | Rewind ÷ nbdkit back to back (median) |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for name, _args, _direction, _target in JOBS:
        if name in BACK_TO_BACK_SKIPS:
            continue
        busy = results[f"{name} b2b"]
        steady = [b / r for b, r in zip(busy["rewind"], results[name]["rewind"])]
        low, median, high = spread(steady)
        mark = "met" if median >= 0.9 else "**missed**"
        nbdkit_steady = statistics.median([b / r for b, r in zip(busy["nbdkit"], results[name]["nbdkit"])])
        versus = statistics.median([o / b for o, b in zip(busy["rewind"], busy["nbdkit"])])
        lines.append(
            f"| {name} | {statistics.median(busy['rewind']) / 2**20:.0f} MiB/s | {low:.2f} / {median:.2f} / "
            f"{high:.2f} | ≥ 0.9 | {mark} | {nbdkit_steady:.2f} | {versus:.2f} |"
        )
    low, median, high = spread(view_results["seqread"])
    lines += [
        "",
        "Views (Rewind only):",
        "",
        "| measurement | min / median / max | target | |",
        "|---|---|---:|---|",
        "| 1 MiB sequential read of a view at a bookmark before the overwrite (its history as the server keeps it, "
        f"laid out in the background) ÷ the same read of the live volume | "
        # Issue 13, req 3; here after every job's history, where
        # bench/views.py reads a volume with only the fill and the overwrite.
        f"{low:.2f} / {median:.2f} / {high:.2f} | ≥ 0.8 | {'met' if median >= 0.8 else '**missed**'} |",
    ]
    low, median, high = spread(view_results["seqread_device"])
    lines.append(
        "| the same view read ÷ the device's own 1 MiB sequential read (direct I/O, same run) | "
        f"{low:.2f} / {median:.2f} / {high:.2f} | | |"
    )
    for key, what in [
        ("seqread_warm", "after the jobs back to back, the view read ÷ the live read, both read once and then "
         "again, the second reads taken (both from the page cache)"),
        ("seqread_cold", "after the jobs back to back, the view read ÷ the live read, both from the disk (the page "
         "cache dropped before each)"),
        ("seqread_defrag_warm", "the same, page cache warm, after `rewind volume defrag` of the view (chunks it "
         f"moved: {' / '.join(str(moved) for moved in view_results['defrag_moved'])})"),
        ("seqread_defrag_cold", "the same, from the disk, after `rewind volume defrag` of the view"),
    ]:
        low, median, high = spread(view_results[key])
        lines.append(
            f"| {what} | {low:.2f} / {median:.2f} / {high:.2f} | ≥ 0.8 | {'met' if median >= 0.8 else '**missed**'} |"
        )
    lines.append(
        "| MiB of packs the server wrote laying out the bookmark's history in the background, per run | "
        f"{' / '.join(f'{written / 2**20:.0f}' for written in view_results['layout_bytes'])} | | |"
    )
    opens = view_results["open"]
    view_ms = [o[0] * 1000 for o in opens]
    live_ms = [o[1] * 1000 for o in opens]
    base_ms = [o[2] * 1000 for o in opens]
    lines.append(
        "| `nbdinfo --size` of a view at the volume's creation, ms (median of 15 per run; process start included) | "
        f"{min(view_ms):.1f} / {statistics.median(view_ms):.1f} / {max(view_ms):.1f} "
        f"(live volume {statistics.median(live_ms):.1f}, nbdkit {statistics.median(base_ms):.1f}) | milliseconds | |"
    )
    lines.append(
        f"| versions in the history when the views were read | {min(view_results['versions']):,} – "
        f"{max(view_results['versions']):,} (archived: {min(view_results['archived']):,} – "
        f"{max(view_results['archived']):,}) | | |"
    )
    chunks = view_results["chunks"]
    lines += [
        "",
        "The chunk store at the end of each run (fio's default buffers: random bytes, lightly scrambled per "
        "write, so little deduplicates or compresses):",
        "",
        "| run | logical history | stored in packs | dedup | compression |",
        "|---|---:|---:|---:|---:|",
    ]
    for index, node in enumerate(chunks):
        lines.append(
            f"| {index} | {node['logical_bytes'] / 2**30:.1f} GiB | {node['pack_bytes'] / 2**30:.1f} GiB | "
            f"{node['dedup_ratio']:.2f} | {node['compression_ratio']:.2f} |"
        )
    lines.append("<!-- nbd:end -->")
    return "\n".join(lines)




def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--runtime", type=int, default=15)
    parser.add_argument("--dir", default=str(ROOT / "target" / "bench-nbd"))
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--core", help="also run Rewind at this revision (e.g. 41e2a30, before the chunk store)")
    args = parser.parse_args()
    for tool in ["fio", "nbdkit", "nbdinfo"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install fio nbdkit libnbd-bin")
    check_free_space(args)
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "rewind-cli"], cwd=ROOT, check=True)
    args.core_binary = build_core(args.core) if args.core else None
    env = environment()
    results, view_results = {}, {}
    for run_index in range(args.runs):
        run_once(args, run_index, results, view_results)
    section = table(args, results, view_results, env)
    write_section("nbd", section)
    print(section)


if __name__ == "__main__":
    main()
