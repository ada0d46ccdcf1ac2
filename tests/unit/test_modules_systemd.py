"""systemd_unit: state from `systemctl show`, unit files, and restart/reload as proven actions."""

from __future__ import annotations

import hashlib

import pytest

from deployer.connection import CommandFailed, CommandResult, ScriptedConnection
from deployer.modules.systemd import SystemdUnit, start_from_disk_script


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


def read_result(stdout: str) -> CommandResult:
    return CommandResult("read", 0, stdout, "")


def observe(m: SystemdUnit, args: dict, stdout: str):
    return m.observe(args, read_result(stdout))


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
    assert start == start_from_disk_script("node_exporter.service")


def test_a_started_unit_whose_file_did_not_change_is_only_started_when_down() -> None:
    _, _, conn = write({"content": UNIT, "state": "started"}, unit_file(UNIT) + show("inactive"))
    assert conn.commands == ["systemctl start -- node_exporter.service"]


class FakeSystemd:
    """``systemctl`` and ``ps`` on PATH for ``start_from_disk_script``, run by a real ``sh``:
    each ``systemctl show`` answers the next state (the last one repeats), ``ps`` the main
    process' age; what the script asked systemd to do is logged."""

    def __init__(self, tmp_path, states: list[str], ages: list[int]) -> None:
        self.dir = tmp_path
        (tmp_path / "states").write_text("\n".join(states) + "\n")
        (tmp_path / "ages").write_text("\n".join(map(str, ages)) + "\n")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        pop = (
            'f="$D/$1"; line=$(head -n 1 "$f"); '
            '[ "$(wc -l < "$f")" -gt 1 ] && sed -i 1d "$f"; printf "%s\\n" "$line"'
        )
        (bin_dir / "systemctl").write_text(
            "#!/bin/sh\n"
            f"pop() {{ {pop}; }}\n"
            'if [ "$1" = show ]; then pop states | tr " " "\\n"; exit 0; fi\n'
            'echo "$*" >> "$D/asked"\n'
        )
        (bin_dir / "ps").write_text(f"#!/bin/sh\npop() {{ {pop}; }}\npop ages\n")
        for f in ("systemctl", "ps"):
            (bin_dir / f).chmod(0o755)

    def run(self, unit: str = "prometheus.service") -> list[str]:
        import os
        import subprocess

        env = {**os.environ, "PATH": f"{self.dir / 'bin'}:{os.environ['PATH']}", "D": str(self.dir)}
        subprocess.run(["sh", "-c", start_from_disk_script(unit)], env=env, check=True, timeout=20)
        asked = self.dir / "asked"
        return asked.read_text().splitlines() if asked.exists() else []


def state(active: str, sub: str, restarts: int = 0, pid: int = 4242) -> str:
    return f"ActiveState={active} SubState={sub} NRestarts={restarts} MainPID={pid}"


@pytest.mark.parametrize(
    "states, ages, asked",
    [
        pytest.param(
            [state("activating", "auto-restart", 1, 0)],
            [],
            ["restart -- prometheus.service"],
            id="between-two-crashes-restarted-now-not-after-the-restart-timer",
        ),
        pytest.param(
            [state("activating", "start")],
            [],
            ["restart -- prometheus.service"],
            id="still-starting-from-the-old-file",
        ),
        pytest.param(
            [state("failed", "failed", 0, 0)], [], ["start -- prometheus.service"], id="failed"
        ),
        pytest.param(
            [state("inactive", "dead", 0, 0)], [], ["start -- prometheus.service"], id="stopped"
        ),
        pytest.param(
            [state("active", "running", 0)], [1], [], id="running-never-restarted-by-systemd"
        ),
        pytest.param(
            [state("active", "running", 3)], [86400], [], id="running-for-a-day-after-old-crashes"
        ),
        pytest.param(
            [
                state("active", "running", 1),
                state("active", "running", 1),
                state("activating", "auto-restart", 1),
            ],
            [1, 1],
            ["restart -- prometheus.service"],
            id="a-young-run-of-a-crash-loop-watched-until-it-crashes",
        ),
        pytest.param(
            [state("active", "running", 1)],
            [2, 5, 8, 11],
            [],
            id="a-young-run-that-lives-the-settle-time-is-serving",
        ),
    ],
)
def test_a_replaced_unit_not_serving_starts_from_the_file_on_disk(
    tmp_path, states, ages, asked
) -> None:
    assert FakeSystemd(tmp_path, states, ages or [0]).run() == asked


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


def test_restart_is_proven_by_a_new_invocation_against_the_read_before_it() -> None:
    m, a, conn = write({"state": "restarted"}, show(invocation="inv1"))
    assert conn.commands == ["systemctl restart -- node_exporter.service"]
    before = observe(m, a, show(invocation="inv1"))
    # The engine's re-read after the write: another invocation is running -> in desired state.
    assert m.observe(a, read_result(show(invocation="inv2")), before=before).differences == {}
    # The next time the handler runs (no write behind the read), it acts again.
    assert observe(m, a, show(invocation="inv2")).differences == {"restarted": (False, True)}
    assert vars(m) == {}  # no proof kept on the instance between calls


def test_restart_that_kept_the_old_invocation_is_not_in_desired_state() -> None:
    m, a, _ = write({"state": "restarted"}, show(invocation="inv1"))
    before = observe(m, a, show(invocation="inv1"))
    diffs = m.observe(a, read_result(show(invocation="inv1")), before=before).differences
    assert diffs == {"restarted": (False, True)}


def test_restarted_unit_that_died_after_restart_is_not_in_desired_state() -> None:
    m, a, _ = write({"state": "restarted"}, show(invocation="inv1"))
    before = observe(m, a, show(invocation="inv1"))
    after = m.observe(a, read_result(show(active="failed", invocation="inv2")), before=before)
    assert after.differences["restarted"] == (False, True)


def test_owed_restart_is_done_when_a_newer_invocation_runs_than_at_the_change() -> None:
    m = SystemdUnit()
    a = m.validate({"name": "prometheus", "state": "restarted"})
    assert m.observe(a, read_result(show(invocation="inv2")), baseline="inv1\n").differences == {}


def test_owed_restart_acts_while_the_invocation_of_the_change_still_runs() -> None:
    m = SystemdUnit()
    a = m.validate({"name": "prometheus", "state": "restarted"})
    obs = m.observe(a, read_result(show(invocation="inv1")), baseline="inv1")
    assert obs.differences == {"restarted": (False, True)}


def test_owed_restart_of_a_unit_started_after_the_change_needs_none() -> None:
    # A first deploy: the unit did not run when its unit file was written (baseline empty).
    m = SystemdUnit()
    a = m.validate({"name": "prometheus", "state": "restarted"})
    assert m.observe(a, read_result(show(invocation="inv1")), baseline="").differences == {}


def test_owed_restart_of_a_stopped_unit_acts() -> None:
    m = SystemdUnit()
    a = m.validate({"name": "prometheus", "state": "restarted"})
    obs = m.observe(a, read_result(show(active="inactive", invocation="")), baseline="")
    assert obs.differences["restarted"] == (False, True)


def test_only_a_restart_has_a_baseline_script() -> None:
    m = SystemdUnit()
    restart = m.validate({"name": "prometheus", "state": "restarted"})
    assert m.baseline_script(restart) == (
        "systemctl show -p InvocationID --value -- prometheus.service"
    )
    for state in ("started", "stopped", "reloaded"):
        assert m.baseline_script(m.validate({"name": "prometheus", "state": state})) is None


TAKES_DOWN = [
    pytest.param({"state": "restarted"}, show(), "restart of x.service", id="restart-running"),
    pytest.param({"state": "restarted"}, show(active="inactive", invocation=""), None, id="start"),
    pytest.param({"state": "stopped"}, show(), "stop of x.service", id="stop-running"),
    pytest.param({"state": "reloaded"}, show(), None, id="reload"),
    pytest.param({"state": "started"}, show(), None, id="already-started"),
]


@pytest.mark.parametrize(("args", "stdout", "expected"), TAKES_DOWN)
def test_takes_down_names_only_writes_that_stop_a_running_unit(args, stdout, expected) -> None:
    m = SystemdUnit()
    a = m.validate({"name": "x", **args})
    assert m.takes_down(a, observe(m, a, stdout)) == expected


def test_reload_of_a_running_unit_reloads_and_keeps_its_invocation() -> None:
    m, a, conn = write({"state": "reloaded"}, show(invocation="inv1"))
    assert conn.commands[0] == "systemctl reload -- node_exporter.service"
    before = observe(m, a, show(invocation="inv1"))
    assert m.observe(a, read_result(show(invocation="inv1")), before=before).differences == {}
    diffs = m.observe(a, read_result(show(invocation="inv2")), before=before).differences
    assert diffs == {"reloaded": (False, True)}


def test_reload_of_a_stopped_unit_starts_it() -> None:
    _, _, conn = write({"state": "reloaded"}, show(active="inactive", invocation=""))
    assert conn.commands == ["systemctl start -- node_exporter.service"]


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


# ---- exec_check: the daemon's own flag parser refuses a unit before it replaces the live one

PROMETHEUS_UNIT = """[Unit]
Description=Prometheus
[Service]
ExecStart=/usr/local/bin/prometheus \\
    --config.file=/etc/prometheus/prometheus.yml \\
# a comment between continuation lines
    --storage.tsdb.retention.time=15d \\
    --web.enable-lifecycle
ExecReload=/bin/kill -HUP $MAINPID
"""


def test_exec_start_joins_continuation_lines_and_skips_comments_between_them() -> None:
    from deployer.modules.systemd import exec_start

    assert exec_start(PROMETHEUS_UNIT) == [
        "/usr/local/bin/prometheus",
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.retention.time=15d",
        "--web.enable-lifecycle",
    ]


def checked_unit(content: str = PROMETHEUS_UNIT) -> tuple[SystemdUnit, dict]:
    from deployer.modules.base import PrepareContext

    m = SystemdUnit()
    a = m.validate({"name": "prometheus", "content": content, "exec_check": "--version"})
    ctx = PrepareContext(find_file=lambda k, r: r, render_template=lambda p: p)
    return m, m.prepare(a, ctx)


def test_exec_check_refusal_leaves_the_unit_file_as_it_was() -> None:
    m, a = checked_unit()
    conn = ScriptedConnection().on(
        "--version", rc=1, stdout="prometheus: error: unknown long flag '--no-such-flag'\n"
    )
    with pytest.raises(CommandFailed) as failed:
        m.write(conn, a, observe(m, a, unit_file("old") + show()))
    assert conn.commands == [
        "timeout 30 /usr/local/bin/prometheus --config.file=/etc/prometheus/prometheus.yml "
        "--storage.tsdb.retention.time=15d --web.enable-lifecycle --version </dev/null 2>&1"
    ]
    message = failed.value.result.stderr
    assert "refused by /usr/local/bin/prometheus itself" in message
    assert "unknown long flag '--no-such-flag'" in message


def test_exec_check_that_passes_lets_the_unit_file_be_written() -> None:
    m, a = checked_unit()
    conn = ScriptedConnection()
    m.write(conn, a, observe(m, a, unit_file("old") + show()))
    assert conn.commands[0].endswith("--version </dev/null 2>&1")
    assert "mv -f" in conn.commands[1] or "prometheus.service" in conn.commands[1]
    assert "systemctl daemon-reload" in conn.commands


def test_exec_check_runs_only_when_the_unit_file_changes() -> None:
    m, a = checked_unit()
    conn = ScriptedConnection()
    m.write(conn, a, observe(m, a, unit_file(PROMETHEUS_UNIT) + show(reload_needed="yes")))
    assert conn.commands == ["systemctl daemon-reload"]


def test_exec_check_runs_the_program_for_real() -> None:
    import subprocess

    class Local:
        name = "local"

        def run(self, command, *, stdin=None, timeout=None):
            p = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
            return CommandResult(command, p.returncode, p.stdout, p.stderr)

    m, a = checked_unit("[Service]\nExecStart=/bin/sh -c 'echo refused: >&2; exit 3'\n")
    with pytest.raises(CommandFailed) as failed:
        m._exec_check(Local(), a)
    assert "exit 3" in failed.value.result.stderr
    assert "refused:" in failed.value.result.stderr


@pytest.mark.parametrize(
    "content",
    [
        "[Service]\nExecStart=/usr/bin/x --name=%i\n",
        "[Service]\nExecStart=/usr/bin/x $OPTIONS\n",
        "[Service]\nExecStart=/usr/bin/x\nExecStart=/usr/bin/y\n",
        "[Service]\nType=oneshot\n",
    ],
    ids=["specifier", "variable", "two", "none"],
)
def test_exec_check_refuses_at_plan_time_what_it_cannot_run_as_systemd_would(content) -> None:
    from deployer.modules.base import ArgError

    with pytest.raises(ArgError):
        checked_unit(content)


def test_diagnose_reads_the_units_state_and_last_journal_lines() -> None:
    m = SystemdUnit()
    a = m.validate({"name": "prometheus", "state": "restarted"})
    conn = ScriptedConnection().on("journalctl", stdout="state of prometheus.service: x\n")
    assert m.diagnose(a, conn) == "state of prometheus.service: x"
    assert "journalctl -u prometheus.service --no-pager -n 20" in conn.commands[0]


def test_the_unit_report_puts_the_daemons_error_line_before_its_usage_text(tmp_path) -> None:
    # Prometheus prints its flag error, then ~100 lines of usage: the error is no last line.
    import subprocess

    from deployer.modules.systemd import unit_report_script

    usage = "".join(
        f"prometheus[7]:   --flag{i}  above. One of: [debug, info, warn, error]\n"
        for i in range(30)
    )
    journal = (
        'prometheus[7]: Error parsing commandline arguments: not a valid duration string: "5x"\n'
    )
    for name, text in (
        ("systemctl", "#!/bin/sh\necho ActiveState=activating; echo SubState=auto-restart\n"),
        ("journalctl", f"#!/bin/sh\ncat <<'EOF'\n{journal}{usage}EOF\n"),
    ):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    script = f"PATH={tmp_path}:$PATH\n" + unit_report_script("prometheus.service")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout
    errors = out.split("last error lines in the journal of prometheus.service:\n")[1]
    errors = errors.split("last journal lines")[0]
    assert errors.strip().splitlines() == [journal.strip()]
    assert "ActiveState=activating SubState=auto-restart" in out
