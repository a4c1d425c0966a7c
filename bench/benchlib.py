"""What Rewind's benchmark scripts share: the management API, the machine
they ran on, and writing their section of BENCHMARKS.md."""

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REWIND = ROOT / "target" / "release" / "rewind"


def api(http, method, path, body=None):
    """One call to a Rewind server's management API at `http` (host:port)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{http}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
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
