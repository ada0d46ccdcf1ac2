"""wait_for (bounded polling, reported ok) and reboot (new boot_id, systemd running, bounded)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from deployer.connection import CommandFailed, CommandResult
from deployer.errors import HostUnreachable
from deployer.modules.base import ArgError
from deployer.modules.reboot import REBOOT_COMMAND, Reboot
from deployer.modules.wait_for import WaitFor


class Local:
    name = "local"

    def run(self, command, *, stdin=None, timeout=None):
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return CommandResult(command, p.returncode, p.stdout, p.stderr)


def local_observe(m, a):
    return m.observe(a, Local().run(m.read_script(a)))


# ---- wait_for ---------------------------------------------------------------------------


def test_wait_for_is_never_reported_as_a_change() -> None:
    assert WaitFor.reports_change is False


@pytest.fixture
def listening_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_open_port_is_ready_for_real(listening_port: int) -> None:
    m = WaitFor()
    a = m.validate({"port": listening_port})
    assert local_observe(m, a).differences == {}


def test_closed_port_waits_until_the_deadline_and_fails() -> None:
    m = WaitFor()
    a = m.validate({"port": free_port(), "timeout": 2, "interval": 1})
    obs = local_observe(m, a)
    assert obs.differences == {"ready": (False, True)}
    with pytest.raises(CommandFailed, match=r"port 127.0.0.1:\d+ not ready after 2s"):
        m.write(Local(), a, obs)


def test_port_that_opens_while_waiting_passes() -> None:
    port = free_port()
    m = WaitFor()
    a = m.validate({"port": port, "timeout": 10})
    obs = local_observe(m, a)
    server = socket.socket()

    def open_later() -> None:
        server.bind(("127.0.0.1", port))
        server.listen(1)

    timer = threading.Timer(1.0, open_later)
    timer.start()
    try:
        m.write(Local(), a, obs)
        assert local_observe(m, a).differences == {}
    finally:
        timer.join()
        server.close()


@pytest.fixture
def http_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/-/ready" else 503
            body = b"Prometheus Server is Ready.\n" if code == 200 else b"not yet\n"
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("path", "extra", "ready"),
    [
        ("/-/ready", {}, True),
        ("/-/ready", {"contains": "is Ready"}, True),
        ("/-/ready", {"contains": "Healthy"}, False),
        ("/other", {}, False),
        ("/other", {"status": 503}, True),
    ],
)
def test_http_status_and_body_for_real(
    http_server: str, path: str, extra: dict, ready: bool
) -> None:
    m = WaitFor()
    a = m.validate({"url": http_server + path, **extra})
    assert local_observe(m, a).actual == {"ready": ready}


def test_command_probe_for_real(tmp_path) -> None:
    m = WaitFor()
    flag = tmp_path / "flag"
    a = m.validate({"command": f"test -e {flag}"})
    assert local_observe(m, a).actual == {"ready": False}
    flag.touch()
    assert local_observe(m, a).actual == {"ready": True}


# ---- wait_for watching a systemd unit (the generated shell runs for real; systemctl and
# journalctl are stand-ins on PATH that print what systemd prints, see the lab test for the real
# ones: tests/integration/test_ha_safety.py)

FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl show -p PROPS [--value] -- UNIT, from the test's state file; NRestarts from a counter
# that grows by one per call when the test asks for restarts.
dir=$(dirname "$0")
n=$(cat "$dir/nrestarts")
if [ -f "$dir/restarting" ]; then echo $((n + 1)) > "$dir/nrestarts"; fi
case " $* " in
  *" --value "*) echo "$n" ;;
  *) cat "$dir/state"; echo "NRestarts=$n" ;;
esac
"""
FAKE_JOURNALCTL = """#!/bin/sh
echo "prometheus[42]: Error parsing commandline arguments: not a valid duration string: \\"15x\\""
echo "systemd[1]: prometheus.service: Main process exited, code=exited, status=2/INVALIDARGUMENT"
"""


class LocalWithFakeSystemd(Local):
    def __init__(self, bin_dir) -> None:
        self.bin_dir = bin_dir

    def run(self, command, *, stdin=None, timeout=None):
        return super().run(f"PATH={self.bin_dir}:$PATH\n{command}", stdin=stdin, timeout=timeout)


@pytest.fixture
def fake_systemd(tmp_path):
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL)):
        f = tmp_path / name
        f.write_text(text)
        f.chmod(0o755)
    (tmp_path / "nrestarts").write_text("0\n")
    return tmp_path


def waiting(tmp_path, state: str):
    (tmp_path / "state").write_text(state)
    m = WaitFor()
    a = m.validate({"command": f"test -e {tmp_path}/ready", "unit": "prometheus", "timeout": 30})
    host = LocalWithFakeSystemd(tmp_path)
    return m, a, host, local_observe(m, a)


def test_wait_for_fails_at_once_when_its_unit_is_restarting_after_a_crash(fake_systemd) -> None:
    state = "ActiveState=activating\nSubState=auto-restart\nResult=exit-code\nExecMainStatus=2\n"
    m, a, host, obs = waiting(fake_systemd, state)
    started = time.monotonic()
    with pytest.raises(CommandFailed) as failed:
        m.write(host, a, obs)
    assert time.monotonic() - started < 5  # not the 30 s timeout
    message = failed.value.result.stderr
    assert "prometheus.service is not coming up" in message
    assert "SubState=auto-restart" in message and "ExecMainStatus=2" in message
    assert 'not a valid duration string: "15x"' in message  # its last journal lines


def test_wait_for_fails_when_systemd_restarted_its_unit_since_the_wait_began(fake_systemd) -> None:
    # Between two probes the unit crashed and is running again: NRestarts grew.
    (fake_systemd / "restarting").write_text("")
    m, a, host, obs = waiting(fake_systemd, "ActiveState=active\nSubState=running\n")
    with pytest.raises(CommandFailed) as failed:
        m.write(host, a, obs)
    assert "is not coming up" in failed.value.result.stderr


@pytest.mark.parametrize(
    "state", ["ActiveState=failed\nSubState=failed\n", "ActiveState=inactive\nSubState=dead\n"]
)
def test_wait_for_fails_at_once_when_its_unit_failed_or_stopped(fake_systemd, state) -> None:
    m, a, host, obs = waiting(fake_systemd, state)
    with pytest.raises(CommandFailed) as failed:
        m.write(host, a, obs)
    assert "is not coming up" in failed.value.result.stderr


def test_wait_for_keeps_waiting_while_its_unit_is_starting(fake_systemd) -> None:
    m, a, host, obs = waiting(fake_systemd, "ActiveState=activating\nSubState=start\n")
    threading.Timer(1.5, (fake_systemd / "ready").write_text, args=("",)).start()
    m.write(host, a, obs)  # returns once the probe passes


def test_wait_for_timeout_carries_its_units_journal_lines(fake_systemd) -> None:
    (fake_systemd / "state").write_text("ActiveState=active\nSubState=running\n")
    m = WaitFor()
    a = m.validate({"command": "false", "unit": "prometheus", "timeout": 2, "interval": 1})
    host = LocalWithFakeSystemd(fake_systemd)
    with pytest.raises(CommandFailed) as failed:
        m.write(host, a, local_observe(m, a))
    message = failed.value.result.stderr
    assert message.startswith("command 'false' not ready after 2s")
    assert "Error parsing commandline arguments" in message


def test_wait_for_unit_is_a_unit_name() -> None:
    with pytest.raises(ArgError):
        WaitFor().validate({"port": 9090, "unit": "no spaces please"})
    assert WaitFor().validate({"port": 9090, "unit": "prometheus"})["unit"] == "prometheus.service"


# ---- reboot -----------------------------------------------------------------------------


class RebootingHost:
    """A host session whose boot_id changes after the reboot command, after some failed connects."""

    name = "gpu01"

    def __init__(self, states: list[str], failed_connects: int = 1, old_boot_answers: int = 1):
        self.boot = "boot-a"
        self.states = list(states)
        self.failed_connects = failed_connects
        self.old_boot_answers = old_boot_answers
        self.commands: list[str] = []
        self.reconnects = 0

    def run(self, command, *, stdin=None, timeout=None):
        self.commands.append(command)
        if command == REBOOT_COMMAND:
            return CommandResult(command, 0, "", "")
        if command.startswith("cat /proc/sys/kernel/random/boot_id"):
            if self.old_boot_answers:
                self.old_boot_answers -= 1
                return CommandResult(command, 0, "boot-a\nstopping\n", "")
            self.boot = "boot-b"
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return CommandResult(command, 0, f"boot-b\n{state}\n", "")
        if command.startswith("systemctl --failed"):
            return CommandResult(
                command, 0, "nvidia-persistenced.service loaded failed failed\n", ""
            )
        raise AssertionError(command)

    def reconnect(self, deadline_s: float) -> None:
        self.reconnects += 1
        if self.failed_connects:
            self.failed_connects -= 1
            raise HostUnreachable("gpu01: connection refused")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(Reboot, "clock", staticmethod(c))
    monkeypatch.setattr(Reboot, "sleep", staticmethod(c.sleep))
    return c


def read(m: Reboot, a: dict, boot: str, test: str | None = None, before=None):
    out = f"boot_id={boot}\n" + (f"test={test}\n" if test is not None else "")
    return m.observe(a, CommandResult("read", 0, out, ""), before=before)


def test_reboot_without_test_command_always_acts_then_the_reread_passes(clock) -> None:
    m = Reboot()
    a = m.validate({})
    obs = read(m, a, "boot-a")
    assert obs.differences == {"reboot_needed": (True, False)}
    host = RebootingHost(states=["starting", "running"])
    m.write(host, a, obs)
    assert host.commands[0] == REBOOT_COMMAND
    assert host.reconnects >= 2
    # The engine's re-read, given the observation the write started from: a new boot.
    assert read(m, a, "boot-b", before=obs).differences == {}
    # Still the old boot after the write: not done.
    assert read(m, a, "boot-a", before=obs).differences == {"reboot_needed": (True, False)}
    # The next time the task runs (no write behind the read), it reboots again.
    assert read(m, a, "boot-b").differences == {"reboot_needed": (True, False)}


def test_reboot_only_when_the_test_command_succeeds(clock) -> None:
    m = Reboot()
    a = m.validate({"test_command": "test -e /run/reboot-required"})
    assert read(m, a, "boot-a", test="0").differences == {}
    assert read(m, a, "boot-a", test="1").differences == {"reboot_needed": (True, False)}


def test_test_command_still_true_after_the_reboot_fails_the_reread(clock) -> None:
    m = Reboot()
    a = m.validate({"test_command": "nvidia-smi | grep -q mismatch"})
    obs = read(m, a, "boot-a", test="1")
    m.write(RebootingHost(states=["running"]), a, obs)
    assert read(m, a, "boot-b", test="1", before=obs).differences == {
        "reboot_needed": (True, False)
    }


def test_host_that_stays_degraded_fails_at_the_deadline_naming_failed_units(clock) -> None:
    m = Reboot()
    a = m.validate({"reboot_timeout": 30})
    with pytest.raises(CommandFailed, match=r"degraded.*nvidia-persistenced\.service"):
        m.write(RebootingHost(states=["degraded"]), a, read(m, a, "boot-a"))
    assert clock.now <= 32


def test_degraded_is_accepted_when_allowed(clock) -> None:
    m = Reboot()
    a = m.validate({"allow_degraded": True})
    obs = read(m, a, "boot-a")
    m.write(RebootingHost(states=["degraded"]), a, obs)
    assert read(m, a, "boot-b", before=obs).differences == {}


def test_host_that_never_comes_back_fails_within_the_timeout(clock) -> None:
    m = Reboot()
    a = m.validate({"reboot_timeout": 20})
    host = RebootingHost(states=["running"], failed_connects=10**6)
    with pytest.raises(CommandFailed, match="not back within 20s: gpu01: connection refused"):
        m.write(host, a, read(m, a, "boot-a"))
    assert clock.now <= 22


def test_reboot_read_script_runs_for_real() -> None:
    m = Reboot()
    a = m.validate({"test_command": "true"})
    obs = local_observe(m, a)
    assert len(obs.actual["boot_id"]) == 36 and obs.actual["reboot_needed"] is True
