"""command: guards decide whether it runs; the run is proven by the guard or used-up proof."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deployer.connection import CommandFailed, CommandResult, ScriptedConnection
from deployer.modules.command import Command


def observe(m: Command, a: dict, stdout: str):
    return m.observe(a, CommandResult("read", 0, stdout, ""))


CASES = [
    pytest.param({"creates": "/opt/x/done"}, "creates=1\n", {}, id="creates-exists"),
    pytest.param(
        {"creates": "/opt/x/done"},
        "creates=0\n",
        {"creates_exists": (False, True)},
        id="creates-missing",
    ),
    pytest.param({"unless": "test -e /x"}, "unless=1\n", {}, id="unless-passes"),
    pytest.param(
        {"unless": "test -e /x"},
        "unless=0\n",
        {"unless_passes": (False, True)},
        id="unless-fails",
    ),
    pytest.param({"changed_when": False}, "guard=none\n", {"ran": (False, True)}, id="no-guard"),
]


@pytest.mark.parametrize(("guard", "stdout", "expected"), CASES)
def test_guard_decides(guard: dict, stdout: str, expected: dict) -> None:
    m = Command()
    a = m.validate({"cmd": "make install", **guard})
    assert observe(m, a, stdout).differences == expected


def test_changed_when_false_reports_ok() -> None:
    m = Command()
    m.validate({"cmd": "ldconfig", "changed_when": False})
    assert m.reports_change is False
    m2 = Command()
    m2.validate({"cmd": "ldconfig", "creates": "/x"})
    assert m2.reports_change is True


def test_write_runs_in_chdir_with_environment() -> None:
    m = Command()
    a = m.validate(
        {"cmd": "make install", "creates": "/opt/x", "chdir": "/src/x",
         "environment": {"PREFIX": "/opt/x y", "JOBS": 4}}
    )  # fmt: skip
    conn = ScriptedConnection()
    m.write(conn, a, observe(m, a, "creates=0\n"))
    assert conn.commands == ["cd -- /src/x && env JOBS=4 'PREFIX=/opt/x y' sh -c 'make install'"]


def test_unguarded_run_is_proven_by_the_read_after_its_own_run_then_acts_again() -> None:
    m = Command()
    a = m.validate({"cmd": "systemctl restart thing", "changed_when": True})
    first = observe(m, a, "guard=none\n")
    m.write(ScriptedConnection(), a, first)
    # The engine's re-read after the write is given the observation the write started from.
    assert (
        m.observe(a, CommandResult("read", 0, "guard=none\n", ""), before=first).differences == {}
    )
    assert observe(m, a, "guard=none\n").differences == {"ran": (False, True)}


def test_failing_command_raises_and_the_module_keeps_nothing() -> None:
    m = Command()
    a = m.validate({"cmd": "false", "changed_when": True})
    with pytest.raises(CommandFailed):
        m.write(ScriptedConnection().on("false", rc=1), a, observe(m, a, "guard=none\n"))
    assert observe(m, a, "guard=none\n").differences == {"ran": (False, True)}
    assert vars(m) == {"reports_change": True}


def test_read_and_write_for_real(tmp_path: Path) -> None:
    """The read script's guards and the write's shell, run with sh on this machine."""
    m = Command()
    target = tmp_path / "out dir" / "done"
    a = m.validate(
        {"cmd": 'mkdir -p "out dir" && echo "$GREETING" > "out dir/done"',
         "creates": str(target), "unless": f"grep -q hello {str(target)!r}",
         "chdir": str(tmp_path), "environment": {"GREETING": "hello"}}
    )  # fmt: skip

    def read():
        out = subprocess.run(["sh", "-c", m.read_script(a)], capture_output=True, text=True)
        return observe(m, a, out.stdout)

    before = read()
    assert set(before.differences) == {"creates_exists", "unless_passes"}

    class Local:
        name = "local"

        def run(self, command, *, stdin=None, timeout=None):
            p = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
            return CommandResult(command, p.returncode, p.stdout, p.stderr)

    m.write(Local(), a, before)
    assert target.read_text() == "hello\n"
    assert read().differences == {}
