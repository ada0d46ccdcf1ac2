"""The lab's own HTTP servers on the controller (the package mirror, the S3 store): started in
their own session with a log, tracked by PID file, waited for until they answer (bounded), and
stopped by that PID file. One owner for that life cycle, so the servers differ only in their
command line and in the URL that proves they serve."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from deployer.lab import procs

STOP_GRACE_S = 5.0


def answers(address: str, port: int, path: str) -> bool:
    """True when ``http://address:port/path`` answers 200. Never through a proxy: the lab's
    servers sit on the lab bridge, and an ``http_proxy`` in the environment must not be asked."""
    try:
        with socket.create_connection((address, port), timeout=0.5):
            pass
    except OSError:
        return False
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{address}:{port}/{path.lstrip('/')}", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve(
    argv: Sequence[str],
    pid_file: Path,
    log: Path,
    probe: Callable[[], bool],
    wait_s: float,
    preexec_fn: Callable[[], None] | None = None,
) -> procs.Tracked | None:
    """Keep the server recorded in ``pid_file`` when it is alive and ``probe`` passes; else kill
    what the file names, start ``argv`` (output appended to ``log``) and wait up to ``wait_s``
    for ``probe``. Returns the running server, or None (the new one killed) when it died or did
    not answer in time: the caller raises its own error, naming ``log``."""
    current = procs.load(pid_file)
    if current is not None and current.alive() and probe():
        return current
    if current is not None:
        procs.kill_hard([current])
    with open(log, "ab") as out:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            preexec_fn=preexec_fn,
        )
    tracked = procs.track(child.pid)
    procs.save(pid_file, tracked)
    deadline = time.monotonic() + wait_s
    while True:
        if probe():
            return tracked
        if child.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    procs.kill_hard([tracked])
    return None


def stop(pid_file: Path) -> None:
    """SIGTERM the server ``pid_file`` records, SIGKILL it after a grace, forget the file."""
    current = procs.load(pid_file)
    if current is not None:
        current.signal(15)
        if procs.wait_gone([current], STOP_GRACE_S):
            procs.kill_hard([current])
    pid_file.unlink(missing_ok=True)
