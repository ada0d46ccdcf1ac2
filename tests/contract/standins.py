"""Stand-in programs that answer from a real capture, so that the product's shell scripts run for
real in a test: each goes into a ``bin`` folder put first on the script's PATH.

A stand-in answers only the command line the capture recorded (or, for nvidia-smi, any
``--query-gpu``/``--query-compute-apps`` the capture's full query can answer); anything else exits
2 naming what it was asked, so a product that changes its question fails the test instead of
reading an answer to another question.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import os
import shlex
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.dpkgdb import Instance, write_db

REPO = Path(__file__).resolve().parents[2]

_SMI = """#!{python}
# stand-in nvidia-smi: answers from the capture {capture} (run {run!r})
import sys
sys.path.insert(0, {repo!r})
from tests.contract.captures import query
args = sys.argv[1:]
qs = [a for a in args if a.startswith(("--query-gpu=", "--query-compute-apps="))]
fs = [a for a in args if a.startswith("--format=")]
if len(args) != 2 or len(qs) != 1 or len(fs) != 1:
    sys.stderr.write("stand-in nvidia-smi: not captured: %s\\n" % " ".join(args))
    sys.exit(2)
kind, fields = qs[0][len("--query-"):].split("=", 1)
fmt = fs[0].split("=", 1)[1].split(",")
asked = fields.split(",")
if {renamed!r} and kind == "gpu" and "driver_version" in asked:
    sys.stdout.write('Field "driver_version" is not a valid field to query.\\n\\n')
    sys.exit(2)
text = open({capture!r}, encoding="utf-8").read()
try:
    out = query(text, "{run} :: query-" + kind, asked,
                header="noheader" not in fmt, units="nounits" not in fmt)
except KeyError as exc:
    sys.stderr.write("stand-in nvidia-smi: %s\\n" % exc)
    sys.exit(2)
sys.stdout.write(out)
"""

_PRINT = """#!/bin/sh
# stand-in {name}: prints {capture} and exits {rc} when called as: {name} {argv}
{guard}cat {capture_q}
exit {rc}
"""
_GUARD = """if [ "$*" != {argv_q} ]; then
    echo "stand-in {name}: not captured: $*" >&2
    exit 2
fi
"""


def _install(bindir: Path, name: str, text: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def nvidia_smi(bindir: Path, capture: Path, run: str, *, renamed: bool = False) -> Path:
    """nvidia-smi answering queries from run ``run`` ("idle" or "load") of an
    nvidia_gpu_exporter capture. ``renamed``: as a driver that has dropped ``driver_version`` for
    ``kmd_version`` would (no capture has one: docs/unverified.md#nvidia-smi-without-driver-version),
    refusing the old name as nvidia-smi refuses a field it does not know (on stdout, exit 2:
    CoHDI/composable-resource-operator#37); the new one is answered from a capture of a driver
    that knows it (R595 on: the L40S 595.80 capture)."""
    script = _SMI.format(
        python=sys.executable, capture=str(capture), run=run, repo=str(REPO), renamed=renamed
    )
    return _install(bindir, "nvidia-smi", script)


def printing(bindir: Path, name: str, argv: list[str] | None, capture: Path, rc: int = 0) -> Path:
    """``name`` printing ``capture`` and exiting ``rc`` when called with exactly ``argv`` (None:
    with any arguments, for a capture of a program that fails before it reads them)."""
    joined = "ANY ARGUMENTS" if argv is None else " ".join(argv)
    guard = "" if argv is None else _GUARD.format(name=name, argv_q=shlex.quote(joined))
    text = _PRINT.format(name=name, argv=joined, guard=guard, capture=capture, rc=rc,
                         capture_q=shlex.quote(str(capture)))  # fmt: skip
    return _install(bindir, name, text)


def dpkg_query(bindir: Path, versions: dict[str, str], native: str = "amd64") -> Path:
    """This machine's real ``dpkg-query`` (and ``dpkg``) over a database of its own in which each
    package of ``versions`` is installed at its version for the ``native`` architecture
    (tests/dpkgdb.py)."""
    db = bindir.parent / "dpkg-db"
    write_db(
        db, bindir, native, *(Instance(n, native, v, multi_arch="") for n, v in versions.items())
    )
    return bindir / "dpkg-query"


def environment(bindir: Path, **extra: str) -> dict[str, str]:
    """The environment a script runs in: the stand-ins first on PATH, then the system's."""
    return {**os.environ, "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            **extra}  # fmt: skip


@contextlib.contextmanager
def serving(body: bytes, basic_auth: tuple[str, str] | None = None) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving ``body`` at /metrics (as dcgm-exporter's text
    format, behind basic auth when given); yields the URL."""
    expected = (
        "Basic " + base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
        if basic_auth
        else None
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            if expected and self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="metrics"')
                self.end_headers()
                self.wfile.write(b"Unauthorized\n")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def answering(bindir: Path, name: str, answers: dict[str, tuple[Path | None, int]]) -> Path:
    """``name`` answering several command lines: ``{"health -c": (file printed, exit status)}``
    (None: prints nothing); any other command line exits 2 naming it."""
    cases = "".join(
        f"{shlex.quote(argv)}) {'cat ' + shlex.quote(str(path)) + '; ' if path else ''}"
        f"exit {rc} ;;\n"
        for argv, (path, rc) in answers.items()
    )
    text = (
        f"#!/bin/sh\n# stand-in {name}: answers {', '.join(map(repr, answers))}\n"
        f'case "$*" in\n{cases}*) echo "stand-in {name}: not captured: $*" >&2; exit 2 ;;\nesac\n'
    )
    return _install(bindir, name, text)
