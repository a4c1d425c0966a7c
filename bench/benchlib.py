"""What Rewind's benchmark scripts share: the management API, the machine
they ran on, and writing their section of BENCHMARKS.md."""

import json
import statistics
import shutil
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REWIND = ROOT / "target" / "release" / "rewind"


# The admin token of each server started, by its API address (host:port).
TOKENS = {}


def remember_token(http, data_dir):
    """Reads the admin token `rewind serve` wrote into `data_dir`, for `api`.
    A server too old to have tokens wrote none; then none is sent."""
    token = Path(data_dir) / "admin-token"
    if token.exists():
        TOKENS[http] = token.read_text().strip()


def api(http, method, path, body=None):
    """One call to a Rewind server's management API at `http` (host:port),
    with the token `remember_token` found for it."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if http in TOKENS:
        headers["Authorization"] = f"Bearer {TOKENS[http]}"
    request = urllib.request.Request(f"http://{http}{path}", data=data, method=method, headers=headers)
    with urllib.request.urlopen(request) as response:
        text = response.read()
        return json.loads(text) if text else None


def environment():
    """The date, commit, machine and tool versions a benchmark ran with."""
    def sh(command):
        return subprocess.run(command, shell=True, capture_output=True, text=True).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": sh(f"git -C {ROOT} rev-parse --short HEAD"),
        "cpu": sh("nproc") + " × " + sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
        "memory": sh("free -g | awk '/Mem:/ {print $2}'") + " GiB",
        "kernel": sh("uname -r"),
        "fio": sh("fio --version"),
        "nbdkit": sh("nbdkit --version"),
    }


def write_section(marker, section):
    """Replaces the text between `<!-- MARKER:begin` and `<!-- MARKER:end -->`
    in BENCHMARKS.md by `section` (which carries the markers), or appends it."""
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    pattern = re.compile(rf"<!-- {marker}:begin.*?<!-- {marker}:end -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def publish(marker, lines):
    """Prints a benchmark's section (`lines`, with its markers) and writes it
    into BENCHMARKS.md."""
    section = "\n".join(lines)
    print(section)
    write_section(marker, section)


# Layouts that file history as versions leave the overlay: their journal is
# only the write-ahead log, emptied at checkpoints, never archived.
HISTORY_AT_DESTAGE = ("split-stream", "split-down-stream", "checkpointing", "cow")


def wait_archived(http, volume, timeout_seconds=600):
    """Waits until the server's background work on `volume` is done: every
    version archived out of the journal into the chunk store (zstd over
    everything just written, which takes both cores for a while; passes run
    every `--archive-interval`, sooner while 64 MiB waits) and every write
    destaged, and every bookmark's history laid out in block order (the
    server does that once it is archived), and the journal's spares written
    in place of the segment files the chunk store adopted. So a measurement
    that follows does not share the CPU or the disk with it by chance.
    Returns the volume's stats."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        stats = api(http, "GET", f"/v1/volumes/{volume}/stats")
        info = api(http, "GET", f"/v1/volumes/{volume}")
        pending_destage = info["stats"]["versions_pending_destage"]
        archived = stats["versions_in_journal"] == 0 or info["layout"] in HISTORY_AT_DESTAGE
        laid_out = info["stats"].get("bookmarks_awaiting_layout", 0) == 0
        spares_written = info["stats"].get("journal_spares_owed", 0) == 0
        if archived and pending_destage == 0 and laid_out and spares_written:
            return stats
        if time.monotonic() > deadline:
            raise RuntimeError(f"archiving of {volume} did not finish in {timeout_seconds} s: {stats}")
        time.sleep(0.5)


def cpu_ticks():
    """This machine's CPU time so far, from the first line of /proc/stat, in
    ticks: (all of it, what the hypervisor took for other guests: steal)."""
    with open("/proc/stat") as stat:
        fields = [int(field) for field in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is in user).
    return sum(fields[:8]), fields[7]


def fio(uri, name, args, size, runtime=None, extra=()):
    """Runs one fio job against an NBD `uri`, or against a file path with
    direct I/O (the device's own limit on the same filesystem). The job's
    `stolen_share` is the share of the machine's CPU time the hypervisor
    took meanwhile: on a shared host, a job run while neighbours were busy
    measures them too."""
    ticks_before, stolen_before = cpu_ticks()
    target = (["--ioengine=nbd", f"--uri={uri}"] if uri.startswith("nbd://")
              else ["--ioengine=libaio", "--direct=1", f"--filename={uri}"])
    command = [
        "fio", "--output-format=json", f"--name={name}", *target,
        f"--size={size}", "--randseed=1", *args, *extra,
    ]
    if runtime:
        command += ["--time_based", f"--runtime={runtime}", "--ramp_time=2"]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode:
        # fio's own words (an errno per failed I/O, say ENOSPC on a full
        # disk), not only its exit status.
        raise RuntimeError(f"fio {name} exited with {finished.returncode}: {finished.stderr[-2000:]}")
    output = finished.stdout
    # fio may print warnings before the JSON.
    result = json.loads(output[output.index("{"):])
    job = result["jobs"][0]
    if job["error"]:
        raise RuntimeError(f"fio {name} failed: error {job['error']}")
    ticks_after, stolen_after = cpu_ticks()
    job["stolen_share"] = (stolen_after - stolen_before) / max(1, ticks_after - ticks_before)
    return job


def throughput(job, direction):
    return job[direction]["bw_bytes"]


class Process:
    def __init__(self, command, ready_pattern=None, **kwargs):
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, **kwargs)
        self.lines = []
        if ready_pattern:
            while True:
                line = self.process.stdout.readline()
                if not line:
                    raise RuntimeError(f"{command[0]} exited before it was ready")
                self.lines.append(line)
                if all(re.search(p, "".join(self.lines)) for p in ready_pattern):
                    break

    def stop(self):
        """SIGTERM, and SIGKILL if it has not exited within 120 s — said on
        stderr, and the measurements already taken are kept: a slow
        shutdown is a finding, not a reason to lose a run."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            print(f"warning: {self.process.args[0]} did not stop within 120 s of SIGTERM; killed", file=sys.stderr)
            self.process.kill()
            self.process.wait()


def wait_port(port):
    import socket
    deadline = time.time() + 30
    while time.time() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def spread(values, digits=2):
    """min / median / max of `values`, to `digits` decimals."""
    return f"{min(values):.{digits}f} / {statistics.median(values):.{digits}f} / {max(values):.{digits}f}"


def size_of(text):
    """Bytes in a size given as `512M` or `2G`."""
    return int(text[:-1]) << {"M": 20, "G": 30}[text[-1]]


def drop_caches():
    """Writes dirty pages back and drops the page cache, so reads go to the disk."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as error:
        print(f"warning: the page cache stays ({error})", flush=True)


def timed(command, **kwargs):
    """Runs `command`; its wall-clock seconds and its stdout."""
    start = time.monotonic()
    output = subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout
    return time.monotonic() - start, output


def start_server(work_dir, nbd, http, options=(), fresh=True):
    """A `work_dir` (emptied first if `fresh`) and a Rewind server on its
    `data` directory, NBD and HTTP on 127.0.0.1 at the given ports, with
    more `rewind serve` options: (work, data, server)."""
    work = Path(work_dir)
    if fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    server = Process(
        [str(REWIND), "serve", "--data-dir", str(data), "--nbd", f"127.0.0.1:{nbd}", "--http", f"127.0.0.1:{http}",
         *options],
        ready_pattern=[r"listening http"],
        env={**os.environ, "RUST_LOG": "warn"},
    )
    return work, data, server



def serve_volume(work_dir, nbd, http, name, size_bytes, options=()):
    """A fresh Rewind server (`start_server`) with one volume `name` made:
    (server, its HTTP address, the volume's NBD URI). The caller stops the
    server."""
    _work, data, server = start_server(work_dir, nbd, http, options)
    try:
        wait_port(nbd)
        address = f"127.0.0.1:{http}"
        remember_token(address, data)
        api(address, "POST", "/v1/volumes", {"name": name, "size_bytes": size_bytes})
    except BaseException:
        server.stop()
        raise
    return server, address, f"nbd://127.0.0.1:{nbd}/{name}"


def wait_destaged(http, volume):
    """Until the volume's destager has caught up with its journal."""
    while api(http, "GET", f"/v1/volumes/{volume}")["stats"]["versions_pending_destage"]:
        time.sleep(0.05)

MINIO_USER, MINIO_PASSWORD = "rewind-bench", "rewind-bench-secret"


def minio_binary():
    if os.environ.get("REWIND_MINIO"):
        return os.environ["REWIND_MINIO"]
    return shutil.which("minio") or str(Path.home() / "go/bin/minio")


def start_minio(directory, port, buckets):
    """A MinIO serving `directory` on 127.0.0.1:`port` with `buckets` made,
    its credentials exported as AWS_* for the processes started after it."""
    for bucket in buckets:
        (Path(directory) / bucket).mkdir(parents=True, exist_ok=True)
    # Its metrics readable without a token: `minio_requests` counts requests.
    env = {**os.environ, "MINIO_ROOT_USER": MINIO_USER, "MINIO_ROOT_PASSWORD": MINIO_PASSWORD,
           "MINIO_PROMETHEUS_AUTH_TYPE": "public"}
    minio = subprocess.Popen(
        [minio_binary(), "server", "--quiet", "--address", f"127.0.0.1:{port}",
         "--console-address", f"127.0.0.1:{port + 100}", str(directory)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    os.environ.update({"AWS_ACCESS_KEY_ID": MINIO_USER, "AWS_SECRET_ACCESS_KEY": MINIO_PASSWORD})
    wait_port(port)
    return minio


def minio_requests(port):
    """MinIO's own count of the S3 requests it served, by API
    (`putobject`, `getobject`, `listobjectsv2`, …), and the bytes it
    received and sent: what a bucket bills for, seen from the bucket."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/minio/v2/metrics/cluster") as response:
        text = response.read().decode()
    requests, received, sent = {}, 0.0, 0.0
    for line in text.splitlines():
        value = line.rsplit(" ", 1)[-1]
        if line.startswith("minio_s3_requests_total{"):
            api_name = re.search(r'api="([^"]+)"', line).group(1)
            requests[api_name] = requests.get(api_name, 0) + float(value)
        elif line.startswith("minio_s3_traffic_received_bytes"):
            received += float(value)
        elif line.startswith("minio_s3_traffic_sent_bytes"):
            sent += float(value)
    return {"requests": requests, "received": received, "sent": sent}


def minio_since(before, after):
    """What MinIO served between two `minio_requests` readings."""
    names = set(before["requests"]) | set(after["requests"])
    return {
        "requests": {name: after["requests"].get(name, 0) - before["requests"].get(name, 0) for name in names},
        "received": after["received"] - before["received"],
        "sent": after["sent"] - before["sent"],
    }


def tear_down(servers, minio, work):
    """Stops the Rewind servers and the MinIO a benchmark started, and
    removes its working directory."""
    for server in servers:
        server.stop()
    minio.terminate()
    minio.wait()
    shutil.rmtree(work, ignore_errors=True)


GANESHA_CONFIG = """
NFS_CORE_PARAM {{
    Bind_addr = 127.0.0.1;
    NFS_Port = {nfs}; MNT_Port = {mount}; NLM_Port = {nlm}; Rquota_Port = {rquota};
    Protocols = 3; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;
}}
NFSV4 {{ Graceless = true; }}
EXPORT {{
    Export_Id = 1; Path = {path}; Pseudo = {path}; Access_Type = RW; Squash = No_Root_Squash;
    Protocols = 3; Transports = TCP;
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = EVENT; }}
"""


def start_ganesha(work, nfs, mount):
    """nfs-ganesha (VFS FSAL) exporting a fresh `work`/export on 127.0.0.1,
    NFS and MOUNT at the given ports (its other services on the two after
    MOUNT's): (process, export directory). Needs root and rpcbind."""
    shutil.rmtree(work, ignore_errors=True)
    export = Path(work) / "export"
    export.mkdir(parents=True)
    config = Path(work) / "ganesha.conf"
    config.write_text(GANESHA_CONFIG.format(nfs=nfs, mount=mount, nlm=mount + 1, rquota=mount + 2, path=export))
    if subprocess.run(["pgrep", "-x", "rpcbind"], capture_output=True).returncode != 0:
        subprocess.run(["rpcbind", "-w"], check=True)
    ganesha = subprocess.Popen(
        ["ganesha.nfsd", "-F", "-f", str(config), "-L", str(Path(work) / "ganesha.log"),
         "-p", str(Path(work) / "ganesha.pid")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_port(nfs)
    wait_port(mount)
    return ganesha, export


def stop_ganesha(ganesha):
    ganesha.terminate()
    ganesha.wait(timeout=120)
