"""The lab's walk of a host's process tree (deployer/lab/procs.py): a process that exits while
the tree is walked is no error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployer.lab import procs


def test_a_live_process_tree_is_walked_parents_first():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in procs.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("error", [FileNotFoundError, ProcessLookupError])
def test_a_process_gone_or_exiting_has_no_children(monkeypatch, error):
    # /proc/<pid>/task of an exiting process fails with ESRCH (ProcessLookupError), of a reaped
    # one with ENOENT
    def vanished(self: Path):  # type: ignore[no-untyped-def]
        raise error(3, "No such process", str(self))

    monkeypatch.setattr(Path, "iterdir", vanished)
    assert procs.children(12345) == []
    assert procs.descendants(12345) == []
