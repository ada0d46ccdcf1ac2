"""Console and JSON reporting of a run: live progress, per-task lines, diffs and the recap.

The engine never prints; it calls the Events methods implemented here. On a terminal the progress
is a live table (rich); elsewhere one line per finished task that is not plain ok, as plain text
(rich is imported only for a terminal: importing it is a visible part of a short run's start-up,
bench/README.md).
"""

from __future__ import annotations

import difflib
import json
import sys
import threading
from typing import Any, TextIO

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
        self.stream = stream or sys.stderr
        self.diff = diff
        self._live_enabled = _is_terminal(self.stream) if live is None else live
        self._console: Any = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._state: dict[str, list[Any]] = {}  # host -> [status, current task, counts]
        self._live: Any = None  # rich.live.Live while a terminal shows the live table

    @property
    def console(self) -> Any:
        """rich's console on the stream (terminals only)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False, soft_wrap=True)
        return self._console

    # ---- lifecycle ----
    def __enter__(self) -> ConsoleReporter:
        if self._live_enabled:
            from rich.live import Live

            self._live = Live(
                self._table(), console=self.console, refresh_per_second=8, transient=True
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _table(self) -> Any:
        from rich.table import Table

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
            shown = (
                result.status != Status.OK
                or bool(result.note)
                or bool(self.diff and result.differences)
            )
            if shown and self._live_enabled:
                self._print_task(result)
        if shown and not self._live_enabled:
            # Not a terminal: plain lines, formatted outside the lock, written in one call (a
            # 200-host cold run has 1,600 of them; rich's markup would serialise the workers).
            text = "".join(f"{line}\n" for line, _ in self._task_lines(result))
            with self._write_lock:
                self.stream.write(text)

    def host_done(self, host: str, status: str) -> None:
        with self._lock:
            if host in self._state:
                self._state[host][0] = status
                self._state[host][1] = ""
            self._refresh()

    # ---- output ----
    def _task_lines(self, r: TaskResult) -> list[tuple[str, str | None]]:
        """The lines reporting one task, each with its style (None: plain)."""
        label = r.status.value + (" (predicted)" if r.predicted else "")
        what = f"{r.role}: {r.task}" if r.role else r.task
        lines: list[tuple[str, str | None]] = [(f"{label:<20} {r.host:<16} {what}", None)]
        if r.error:
            lines += [(f"    {line}", "red") for line in r.error.splitlines()]
        if r.note:
            lines.append((f"    NOTE: {r.note}", "yellow"))
        if self.diff:
            for key, (before, after) in r.differences.items():
                if key != "sha256":
                    lines.append((f"    {key}: {before!r} -> {after!r}", None))
            if r.content_diff is not None:
                text = unified_diff(
                    r.content_diff.path, r.content_diff.before, r.content_diff.after
                )
                for line in text.splitlines():
                    style = (
                        "green" if line.startswith("+") else "red" if line.startswith("-") else None
                    )
                    lines.append((f"    {line}", style))
        return lines

    def _print_task(self, r: TaskResult) -> None:
        from rich.markup import escape

        (first, _), *rest = self._task_lines(r)
        cut = max(20, len(r.status.value + (" (predicted)" if r.predicted else "")))
        self.console.print(f"[{_STYLE[r.status]}]{escape(first[:cut])}[/]{escape(first[cut:])}")
        for line, style in rest:
            # markup off: file content may hold "[" and a trailing "\\" (unit files)
            self.console.print(line, style=style, markup=False)

    def recap(self, report: RunReport) -> None:
        title = "recap" + (" (check mode: nothing was changed)" if report.check_mode else "")
        columns = ("host", "ok", "changed", "failed", "unreachable", "skipped")
        rows = []
        for host, h in report.hosts.items():
            c = h.counts()
            rows.append((host, *(str(c[k]) for k in columns[1:])))
        unreachable = [(host, h.unreachable) for host, h in report.hosts.items() if h.unreachable]
        if not self._live_enabled:
            text = plain_table(title, columns, rows)
            text += "".join(f"unreachable {host}: {why}\n" for host, why in unreachable)
            with self._write_lock:
                self.stream.write(text)
            return
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=title)
        for col in columns:
            table.add_column(col, justify="right" if col != "host" else "left")
        styles = (None, None, "yellow", "red", "magenta", None)
        for row in rows:
            table.add_row(
                *(
                    f"[{style}]{v}[/]" if style and v != "0" else escape(v)
                    for v, style in zip(row, styles, strict=True)
                )
            )
        self.console.print(table)
        for host, why in unreachable:
            self.console.print(f"[magenta]unreachable[/] {escape(host)}: {escape(why)}")


def plain_table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A table drawn like rich's default (heavy head), as plain text: the first column left,
    the others right-aligned. Linear in rows; rich's measuring and rendering of every row is
    what made the recap of a large run slow (bench/README.md)."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]

    def rule(left: str, mid: str, right: str, fill: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def cells(values: tuple[str, ...], bar: str) -> str:
        parts = [
            f" {v.ljust(w) if i == 0 else v.rjust(w)} "
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return bar + bar.join(parts) + bar

    top = rule("┏", "┳", "┓", "━")
    lines = [title.center(len(top)).rstrip(), top, cells(columns, "┃"), rule("┡", "╇", "┩", "━")]
    lines += [cells(r, "│") for r in rows]
    lines.append(rule("└", "┴", "┘", "─"))
    return "\n".join(lines) + "\n"


def write_json(report: RunReport, stream: TextIO | None = None) -> None:
    # One string, one write: json.dump writes each token on its own (60,000 writes for 200
    # hosts' report, 0.13 s of the main thread's CPU under cProfile).
    (stream or sys.stdout).write(json.dumps(report.to_json(), indent=2, default=str) + "\n")


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
