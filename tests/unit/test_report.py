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
