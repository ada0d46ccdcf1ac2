"""The console report off a terminal: one plain line per task that is not plain ok, and a recap
table drawn as text (what CI logs and `2>run.log` capture)."""

from __future__ import annotations

import io

from deployer.report import ConsoleReporter, plain_table
from deployer.results import RunReport, Status, TaskResult


def _result(host: str, status: Status, **kw: object) -> TaskResult:
    return TaskResult(host, "node_exporter", "config", "template", status, **kw)  # type: ignore[arg-type]


def _reporter(**kw: object) -> tuple[ConsoleReporter, io.StringIO]:
    out = io.StringIO()
    return ConsoleReporter(stream=out, live=False, **kw), out  # type: ignore[arg-type]


def test_a_changed_task_is_one_plain_line_and_an_ok_task_none():
    reporter, out = _reporter()
    reporter.task_done(_result("gpu01", Status.OK))
    reporter.task_done(_result("gpu02", Status.CHANGED))
    assert out.getvalue() == f"{'changed':<20} {'gpu02':<16} node_exporter: config\n"


def test_a_failed_task_shows_its_error_lines_indented():
    reporter, out = _reporter()
    reporter.task_done(_result("gpu01", Status.FAILED, error="rc=1: boom\n[x] detail"))
    assert out.getvalue().splitlines()[1:] == ["    rc=1: boom", "    [x] detail"]


def test_an_ok_check_with_a_note_is_shown_with_it():
    """A read-only check that passed but could not judge everything (which kernel GRUB boots,
    whether a key is enrolled) says so: the rollout's preflight prints the same as a NOTE."""
    reporter, out = _reporter()
    reporter.task_done(
        _result("gpu01", Status.OK, note="which kernel its reboot boots cannot be told")
    )
    assert out.getvalue().splitlines() == [
        f"{'ok':<20} {'gpu01':<16} node_exporter: config",
        "    NOTE: which kernel its reboot boots cannot be told",
    ]


def test_diff_mode_prints_attribute_changes_but_not_hashes():
    reporter, out = _reporter(diff=True)
    reporter.task_done(
        _result("gpu01", Status.CHANGED, differences={"mode": ["644", "600"], "sha256": ["a", "b"]})
    )
    assert "    mode: '644' -> '600'" in out.getvalue()
    assert "sha256" not in out.getvalue()


def test_recap_lists_every_host_with_right_aligned_counts():
    report = RunReport(check_mode=False)
    report.host("gpu01").tasks.append(_result("gpu01", Status.CHANGED))
    report.host("prom01").tasks.append(_result("prom01", Status.OK))
    reporter, out = _reporter()
    reporter.recap(report)
    lines = out.getvalue().splitlines()
    assert lines[0].strip() == "recap"
    assert lines[2].split() == ["┃", "host", "┃", "ok", "┃", "changed", "┃", "failed", "┃",
                                "unreachable", "┃", "skipped", "┃"]  # fmt: skip
    assert lines[4] == "│ gpu01  │  0 │       1 │      0 │           0 │       0 │"
    assert lines[5] == "│ prom01 │  1 │       0 │      0 │           0 │       0 │"


def test_plain_table_widens_columns_to_the_longest_cell():
    text = plain_table("t", ("host", "n"), [("a-very-long-host", "12345")])
    rows = text.splitlines()
    assert rows[1] == "┏━━━━━━━━━━━━━━━━━━┳━━━━━━━┓"
    assert rows[3] == "┡━━━━━━━━━━━━━━━━━━╇━━━━━━━┩"
    assert rows[4] == "│ a-very-long-host │ 12345 │"
    assert rows[5] == "└──────────────────┴───────┘"


def test_on_a_terminal_the_same_lines_and_recap_go_through_rich():
    out = io.StringIO()
    reporter = ConsoleReporter(stream=out, live=True)
    with reporter:
        reporter.task_done(_result("gpu01", Status.CHANGED, error="[x] kept as text"))
    report = RunReport(check_mode=True)
    report.host("gpu01").tasks.append(_result("gpu01", Status.CHANGED))
    reporter.recap(report)
    text = out.getvalue()
    assert "changed" in text and "gpu01" in text and "node_exporter: config" in text
    assert "[x] kept as text" in text
    assert "check mode: nothing was changed" in text


def test_recap_names_each_unreachable_host_and_why():
    report = RunReport(check_mode=False)
    report.host("gpu03").unreachable = "gpu03: cannot reach 10.0.0.3:22: timed out"
    reporter, out = _reporter()
    reporter.recap(report)
    assert out.getvalue().splitlines()[-1] == (
        "unreachable gpu03: gpu03: cannot reach 10.0.0.3:22: timed out"
    )


def test_reporting_off_a_terminal_does_not_load_rich():
    import subprocess
    import sys

    code = (
        "import io, sys; from deployer.report import ConsoleReporter; "
        "from deployer.results import RunReport; r = ConsoleReporter(stream=io.StringIO()); "
        "r.recap(RunReport(check_mode=False)); print(any(m.startswith('rich') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_host_that_never_speaks_ssh_is_one_recap_line_without_a_library_traceback(tmp_path):
    """A real loopback listener that accepts TCP and never sends an SSH banner (a wrong port, a
    hung sshd): the run, a process of its own (nothing between paramiko and stderr, as for a
    user), reports the host unreachable in words, once, and paramiko's tracebacks stay out of
    stderr (issue 12, 9)."""
    import json
    import socket
    import subprocess
    import sys

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    port = silent.getsockname()[1]
    role = tmp_path / "roles" / "r" / "tasks"
    role.mkdir(parents=True)
    (role / "main.yml").write_text("- copy: {dest: /tmp/x, content: x}\n")
    (tmp_path / "site.yml").write_text("- hosts: all\n  roles: [r]\n")
    (tmp_path / "inv.yml").write_text(
        f"all:\n  hosts:\n    mute01: {{ansible_host: 127.0.0.1, ansible_port: {port}}}\n"
    )
    # The banner timeout shortened to a second; everything else as the installed command.
    program = (
        "import sys; from deployer import connection; connection.CONNECT_TIMEOUT = 1.0; "
        "from deployer.cli import main; sys.argv[0] = 'gpumon-deploy'; main()"
    )
    args = ["up", "-i", str(tmp_path / "inv.yml"), "--site", str(tmp_path / "site.yml")]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", program, *args, "--output", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        silent.close()
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "SSHException" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "mute01" in line]
    assert lines[-1].startswith("unreachable mute01: ")
    assert "sent no SSH banner" in lines[-1]
    report = json.loads(proc.stdout)
    assert "sent no SSH banner" in report["hosts"]["mute01"]["unreachable"]


def test_verbose_flags_before_and_after_the_command_add_up_and_reset_each_run(tmp_path):
    from click.testing import CliRunner

    from deployer import library_logs
    from deployer.cli import cli

    (tmp_path / "inv.yml").write_text("all:\n  hosts:\n    h1:\n")
    inventory = ["inventory", "-i", str(tmp_path / "inv.yml")]
    try:
        assert CliRunner().invoke(cli, ["-v", *inventory, "-vv"]).exit_code == 0
        assert library_logs.verbosity() == 3
        assert CliRunner().invoke(cli, inventory).exit_code == 0
        assert library_logs.verbosity() == 0
    finally:
        library_logs.set_verbosity(0)
