"""The lab's controller-side HTTP servers (mirror, S3 store): one life cycle, tested on a real
``python -m http.server`` on loopback."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from deployer.lab import localserver, procs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "ok").write_text("ok\n")
    return root


def _argv(port: int, site: Path) -> list[str]:
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(site)]


def test_a_started_server_answers_is_recorded_and_is_kept_by_a_second_serve(
    tmp_path: Path, site: Path
) -> None:
    port = _free_port()
    pid_file, log = tmp_path / "srv.pid", tmp_path / "srv.log"
    probe = lambda: localserver.answers("127.0.0.1", port, "ok")  # noqa: E731
    first = localserver.serve(_argv(port, site), pid_file, log, probe, wait_s=10)
    try:
        assert first is not None and first.alive()
        assert procs.load(pid_file) == first
        again = localserver.serve(_argv(port, site), pid_file, log, probe, wait_s=10)
        assert again == first
    finally:
        localserver.stop(pid_file)
    assert not first.alive()
    assert not pid_file.exists()


def test_a_server_that_exits_returns_none_at_once_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "srv.pid"
    started = time.monotonic()
    server = localserver.serve(
        [sys.executable, "-c", "raise SystemExit(3)"],
        pid_file,
        tmp_path / "srv.log",
        lambda: False,
        wait_s=30,
    )
    assert server is None
    assert time.monotonic() - started < 10
    recorded = procs.load(pid_file)
    assert recorded is None or not recorded.alive()


def test_the_probe_never_asks_a_proxy(
    tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # discard port: nothing answers
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    pid_file = tmp_path / "srv.pid"
    probe = lambda: localserver.answers("127.0.0.1", port, "ok")  # noqa: E731
    server = localserver.serve(_argv(port, site), pid_file, tmp_path / "l", probe, wait_s=10)
    try:
        assert server is not None
        assert localserver.answers("127.0.0.1", port, "/ok")
        assert not localserver.answers("127.0.0.1", port, "missing")
    finally:
        localserver.stop(pid_file)
