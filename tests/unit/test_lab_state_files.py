"""The lab's state files (a host's boots, its supervisor's PID file) are read while they are
written: a reader sees the old content or the new, never an empty file."""

from __future__ import annotations

import threading
from pathlib import Path

from deployer.lab import host as hostmod
from deployer.lab.paths import write_atomic


def test_a_reader_never_sees_a_state_file_empty_while_it_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "boots"
    write_atomic(path, "0\n")
    seen: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for boot in range(1, 3000):
            write_atomic(path, f"{boot}\n")
    finally:
        done.set()
        reader.join()
    assert "" not in seen
    assert path.read_text() == "2999\n"
    assert [p.name for p in tmp_path.iterdir()] == ["boots"]  # no staged file left behind


def test_a_host_that_never_booted_has_zero_boots(tmp_path: Path) -> None:
    files = hostmod.HostFiles(tmp_path / "gpu01")
    assert hostmod.boots(files) == 0
    files.dir.mkdir()
    write_atomic(files.dir / "boots", "3\n")
    assert hostmod.boots(files) == 3
