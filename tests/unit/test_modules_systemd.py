"""systemd_unit: state from `systemctl show`, unit files, and restart/reload as proven actions."""

from __future__ import annotations

import hashlib

import pytest

from deployer.connection import CommandFailed, CommandResult, ScriptedConnection
from deployer.modules.systemd import SystemdUnit


def show(
    active: str = "active",
    file_state: str = "enabled",
    invocation: str = "inv1",
    reload_needed: str = "no",
    load: str = "loaded",
) -> str:
    return (
        "@show\n"
        f"LoadState={load}\nActiveState={active}\nSubState=running\n"
        f"UnitFileState={file_state}\nInvocationID={invocation}\nNeedDaemonReload={reload_needed}\n"
    )


def unit_file(content: str | None, prefix: str = "unit") -> str:
    if content is None:
        return f"@{prefix}\nexists=0\n"
    digest = hashlib.sha256(content.encode()).hexdigest()
    return (
        f"@{prefix}\nexists=1\ntype=regular file\nowner=root\ngroup=root\nmode=644\n"
        f"link='x'\nsha256={digest}\n"
    )


def observe(m: SystemdUnit, args: dict, stdout: str):
    return m.observe(args, CommandResult("read", 0, stdout, ""))


UNIT = "[Unit]\nDescription=node exporter\n[Service]\nExecStart=/usr/bin/node_exporter\n"

READS = [
    pytest.param({"state": "started"}, show(), {}, id="started-and-active"),
    pytest.param(
        {"state": "started"},
        show(active="inactive"),
        {"active": ("inactive", "active")},
        id="started-but-inactive",
    ),
    pytest.param({"state": "stopped"}, show(active="failed"), {}, id="failed-counts-as-stopped"),
    pytest.param(
        {"enabled": True}, show(file_state="disabled"), {"enabled": (False, True)}, id="enable"
    ),
    pytest.param({"enabled": True}, show(file_state="static"), {}, id="static-is-enabled"),
    pytest.param(
        {"masked": True, "state": "stopped"},
        show(active="inactive", file_state="disabled"),
        {"masked": (False, True)},
        id="mask",
    ),
    pytest.param(
        {"content": UNIT, "state": "started"},
        unit_file(None) + show(load="not-found", active="inactive", file_state=""),
        {
            "unit.state": ("absent", "file"),
            "unit.sha256": (None, hashlib.sha256(UNIT.encode()).hexdigest()),
            "unit.owner": (None, "root"),
            "unit.group": (None, "root"),
            "unit.mode": (None, "644"),
            "active": ("inactive", "active"),
        },
        id="new-unit-file",
    ),
    pytest.param(
        {"content": UNIT},
        unit_file(UNIT) + show(reload_needed="yes"),
        {"need_daemon_reload": (True, False)},
        id="unit-file-in-place-but-not-reloaded",
    ),
    pytest.param(
        {"state": "restarted"}, show(), {"restarted": (False, True)}, id="restart-always-acts"
    ),
    pytest.param(
        {"state": "reloaded"}, show(), {"reloaded": (False, True)}, id="reload-always-acts"
    ),
]


@pytest.mark.parametrize(("args", "stdout", "expected"), READS)
def test_read_gives_differences(args: dict, stdout: str, expected: dict) -> None:
    m = SystemdUnit()
    a = m.validate({"name": "node_exporter", **args})
    assert observe(m, a, stdout).differences == expected


def test_read_is_one_systemctl_show_call() -> None:
    m = SystemdUnit()
    script = m.read_script(m.validate({"name": "dcgm-exporter", "state": "started"}))
    assert script == (
        "echo @show\nsystemctl show -p "
        "LoadState,ActiveState,SubState,UnitFileState,InvocationID,NeedDaemonReload "
        "-- dcgm-exporter.service"
    )


def test_no_systemd_is_a_read_error() -> None:
    m = SystemdUnit()
    a = m.validate({"name": "x", "state": "started"})
    with pytest.raises(ValueError, match="systemd"):
        observe(m, a, "@show\n")


def write(args: dict, stdout: str, conn: ScriptedConnection | None = None):
    m = SystemdUnit()
    a = m.validate({"name": "node_exporter", **args})
    obs = observe(m, a, stdout)
    conn = conn or ScriptedConnection()
    m.write(conn, a, obs)
    return m, a, conn


def test_new_unit_file_is_written_reloaded_enabled_started_in_that_order() -> None:
    _, _, conn = write(
        {"content": UNIT, "enabled": True, "state": "started"},
        unit_file(None) + show(load="not-found", active="inactive", file_state=""),
    )
    write_file, reload, enable, start = conn.commands
    assert 'mv -f -- "$t" /etc/systemd/system/node_exporter.service' in write_file
    assert conn.stdins[0] == UNIT.encode()
    assert reload == "systemctl daemon-reload"
    assert enable == "systemctl enable -- node_exporter.service"
    assert start == "systemctl start -- node_exporter.service"


def test_dropin_goes_into_the_units_d_directory() -> None:
    _, _, conn = write(
        {"dropins": {"limits": "[Service]\nLimitNOFILE=65536\n"}},
        unit_file(None, "dropin.limits.conf") + show(),
    )
    assert conn.commands[0] == "mkdir -p -m 0755 -- /etc/systemd/system/node_exporter.service.d"
    assert '"$t" /etc/systemd/system/node_exporter.service.d/limits.conf' in conn.commands[1]
    assert conn.commands[2] == "systemctl daemon-reload"


def test_stop_then_mask() -> None:
    _, _, conn = write(
        {"masked": True, "state": "stopped"}, show(active="active", file_state="disabled")
    )
    assert conn.commands == [
        "systemctl stop -- node_exporter.service",
        "systemctl mask -- node_exporter.service",
    ]


def test_restart_is_proven_by_a_new_invocation_and_the_proof_is_used_up() -> None:
    conn = ScriptedConnection().on("--value", stdout="inv2\n")
    m, a, conn = write({"state": "restarted"}, show(invocation="inv1"), conn)
    assert conn.commands[0] == "systemctl restart -- node_exporter.service"
    # The engine's re-read after the write: the new invocation is running -> in desired state.
    assert observe(m, a, show(invocation="inv2")).differences == {}
    # The next time the handler runs, it acts again.
    assert observe(m, a, show(invocation="inv2")).differences == {"restarted": (False, True)}


def test_restart_that_kept_the_old_invocation_fails() -> None:
    conn = ScriptedConnection().on("--value", stdout="inv1\n")
    with pytest.raises(CommandFailed, match="did not start a new invocation"):
        write({"state": "restarted"}, show(invocation="inv1"), conn)


def test_restarted_unit_that_died_after_restart_is_not_in_desired_state() -> None:
    conn = ScriptedConnection().on("--value", stdout="inv2\n")
    m, a, _ = write({"state": "restarted"}, show(invocation="inv1"), conn)
    diffs = observe(m, a, show(active="failed", invocation="inv2")).differences
    assert diffs["restarted"] == (False, True)


def test_reload_of_a_running_unit_reloads_and_keeps_its_invocation() -> None:
    conn = ScriptedConnection().on("--value", stdout="inv1\n")
    m, a, conn = write({"state": "reloaded"}, show(invocation="inv1"), conn)
    assert conn.commands[0] == "systemctl reload -- node_exporter.service"
    assert observe(m, a, show(invocation="inv1")).differences == {}


def test_reload_of_a_stopped_unit_starts_it() -> None:
    conn = ScriptedConnection().on("--value", stdout="inv9\n")
    _, _, conn = write({"state": "reloaded"}, show(active="inactive", invocation=""), conn)
    assert conn.commands[0] == "systemctl start -- node_exporter.service"


def test_in_desired_state_writes_nothing() -> None:
    _, _, conn = write({"state": "started", "enabled": True}, show())
    assert conn.commands == []


def test_failed_start_raises_with_systemctls_message() -> None:
    conn = ScriptedConnection().on(
        "systemctl start",
        rc=1,
        stderr="Job for x.service failed because the control process exited",
    )
    with pytest.raises(CommandFailed, match=r"Job for x\.service failed"):
        write({"state": "started"}, show(active="inactive"), conn)


def test_template_src_is_rendered_at_plan_time() -> None:
    from deployer.modules.base import PrepareContext

    m = SystemdUnit()
    a = m.validate({"name": "x", "src": "x.service.j2", "state": "started"})
    ctx = PrepareContext(
        find_file=lambda kind, rel: f"/roles/r/{kind}/{rel}",
        render_template=lambda path: f"rendered {path}",
    )
    a = m.prepare(a, ctx)
    assert a["content"] == "rendered /roles/r/templates/x.service.j2"
    assert "/etc/systemd/system/x.service" in m.read_script(a)
