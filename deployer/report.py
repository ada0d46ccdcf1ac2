"""Console and JSON reporting of a run: live progress, per-task lines, diffs and the recap.

The engine never prints; it calls the Events methods implemented here. On a terminal the progress
is a live table (rich); elsewhere one line per finished task that is not plain ok.
"""

from __future__ import annotations

import difflib
import json
import sys
import threading
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from deployer.plan import PlannedTask
from deployer.results import RunReport, Status, TaskResult

_STYLE = {
    Status.OK: "green",
    Status.CHANGED: "yellow",
    Status.FAILED: "bold red",
    Status.SKIPPED: "cyan",
    Status.UNREACHABLE: "bold magenta",
}


def unified_diff(path: str, before: str | None, after: str | None) -> str:
    a = (before or "").splitlines(keepends=True)
    b = (after or "").splitlines(keepends=True)
    lines = difflib.unified_diff(
        a,
        b,
        fromfile=f"{path} (before)" if before is not None else "/dev/null",
        tofile=f"{path} (after)",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class ConsoleReporter:
    """Implements executor Events for people; writes to stderr when stdout carries JSON."""

    def __init__(
        self, *, diff: bool = False, stream: TextIO | None = None, live: bool | None = None
    ) -> None:
        self.console = Console(file=stream or sys.stderr, highlight=False, soft_wrap=True)
        self.diff = diff
        self._live_enabled = self.console.is_terminal if live is None else live
        self._lock = threading.Lock()
        self._state: dict[str, list[Any]] = {}  # host -> [status, current task, counts]
        self._live: Live | None = None

    # ---- lifecycle ----
    def __enter__(self) -> ConsoleReporter:
        if self._live_enabled:
            self._live = Live(
                self._table(), console=self.console, refresh_per_second=8, transient=True
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _table(self) -> Table:
        table = Table(title="gpumon-deploy", expand=False)
        for col in ("host", "state", "task", "ok", "changed", "failed"):
            table.add_column(col)
        for host, (status, task, counts) in sorted(self._state.items()):
            table.add_row(
                host, status, task, str(counts["ok"]), str(counts["changed"]), str(counts["failed"])
            )
        return table

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    # ---- Events ----
    def host_started(self, host: str) -> None:
        with self._lock:
            entry = self._state.setdefault(
                host, ["running", "", {"ok": 0, "changed": 0, "failed": 0}]
            )
            entry[0] = "running"
            self._refresh()

    def task_started(self, host: str, task: PlannedTask) -> None:
        with self._lock:
            entry = self._state.setdefault(
                host, ["running", "", {"ok": 0, "changed": 0, "failed": 0}]
            )
            entry[1] = f"{task.role}: {task.name}"
            self._refresh()

    def task_done(self, result: TaskResult) -> None:
        with self._lock:
            entry = self._state.setdefault(
                result.host, ["running", "", {"ok": 0, "changed": 0, "failed": 0}]
            )
            if result.status.value in entry[2]:
                entry[2][result.status.value] += 1
            self._refresh()
            if result.status != Status.OK or (self.diff and result.differences):
                self._print_task(result)

    def host_done(self, host: str, status: str) -> None:
        with self._lock:
            if host in self._state:
                self._state[host][0] = status
                self._state[host][1] = ""
            self._refresh()

    # ---- output ----
    def _print_task(self, r: TaskResult) -> None:
        label = r.status.value + (" (predicted)" if r.predicted else "")
        what = f"{r.role}: {r.task}" if r.role else r.task
        self.console.print(
            f"[{_STYLE[r.status]}]{label:<20}[/] {escape(r.host):<16} {escape(what)}"
        )
        if r.error:
            for line in r.error.splitlines():
                self.console.print(f"    {line}", style="red", markup=False)
        if self.diff:
            for key, (before, after) in r.differences.items():
                if key != "sha256":
                    self.console.print(f"    {key}: {before!r} -> {after!r}", markup=False)
            if r.content_diff is not None:
                text = unified_diff(
                    r.content_diff.path, r.content_diff.before, r.content_diff.after
                )
                for line in text.splitlines():
                    style = (
                        "green" if line.startswith("+") else "red" if line.startswith("-") else ""
                    )
                    # markup off: file content may hold "[" and a trailing "\\" (unit files)
                    self.console.print(f"    {line}", style=style or None, markup=False)

    def recap(self, report: RunReport) -> None:
        table = Table(
            title="recap" + (" (check mode: nothing was changed)" if report.check_mode else "")
        )
        for col in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
            table.add_column(col, justify="right" if col != "host" else "left")
        for host, h in report.hosts.items():
            c = h.counts()
            table.add_row(
                host,
                str(c["ok"]),
                f"[yellow]{c['changed']}[/]" if c["changed"] else "0",
                f"[red]{c['failed']}[/]" if c["failed"] else "0",
                f"[magenta]{c['unreachable']}[/]" if c["unreachable"] else "0",
                str(c["skipped"]),
            )
        self.console.print(table)
        for host, h in report.hosts.items():
            if h.unreachable:
                self.console.print(
                    f"[magenta]unreachable[/] {escape(host)}: {escape(h.unreachable)}", markup=True
                )


def write_json(report: RunReport, stream: TextIO | None = None) -> None:
    json.dump(report.to_json(), stream or sys.stdout, indent=2, default=str)
    (stream or sys.stdout).write("\n")
