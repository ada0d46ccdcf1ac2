"""Result types of a run and the run report (``to_json``): per host counts, per task outcomes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from deployer.modules.base import ContentDiff


class Status(StrEnum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNREACHABLE = "unreachable"


@dataclass
class TaskResult:
    host: str
    role: str
    task: str
    module: str
    status: Status
    duration_s: float = 0.0
    error: str | None = None
    # Changes of attributes: {key: [before, after]}, secrets already masked.
    differences: dict[str, Any] = field(default_factory=dict)
    content_diff: ContentDiff | None = None
    predicted: bool = False  # check mode: would change (or depends on an earlier change)
    handler: bool = False
    source: str | None = None
    wrote: bool = False  # the write side ran (a changed_when: false task writes and stays ok)
    # A handler an earlier run owed this host (its change was made, the handler never ran):
    # when it became owed, the host's UTC time.
    owed_since: str | None = None
    # The task's tags (with its play's): how a caller recognises a task, never by its name.
    tags: frozenset[str] = frozenset()
    # A read-only check that passed with a remark: what it could not judge (module.note)
    note: str | None = None

    @property
    def changed(self) -> bool:
        return self.status == Status.CHANGED

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "task": self.task,
            "module": self.module,
            "status": str(self.status),
            "changed": self.changed,
            "duration_s": round(self.duration_s, 4),
            "error": self.error,
        }
        if self.predicted:
            out["predicted"] = True
        if self.handler:
            out["handler"] = True
        if self.owed_since is not None:
            out["owed_since"] = self.owed_since
        if self.note:
            out["note"] = self.note
        if self.differences:
            out["differences"] = self.differences
        if self.content_diff is not None:
            out["diff"] = {
                "path": self.content_diff.path,
                "before": self.content_diff.before,
                "after": self.content_diff.after,
            }
        return out


@dataclass
class HostReport:
    host: str
    tasks: list[TaskResult] = field(default_factory=list)
    unreachable: str | None = None  # why, when the host could not be reached
    failed: bool = False

    def counts(self) -> dict[str, int]:
        c = {s.value: 0 for s in Status}
        for t in self.tasks:
            c[t.status.value] += 1
        if self.unreachable and c["unreachable"] == 0:
            c["unreachable"] = 1
        return c

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts(),
            "unreachable": self.unreachable,
            "failed": self.failed,
            "tasks": [t.to_json() for t in self.tasks],
        }


@dataclass
class RunReport:
    check_mode: bool = False
    started: float = field(default_factory=time.time)
    finished: float | None = None
    hosts: dict[str, HostReport] = field(default_factory=dict)

    def host(self, name: str) -> HostReport:
        if name not in self.hosts:
            self.hosts[name] = HostReport(name)
        return self.hosts[name]

    @classmethod
    def merged(cls, reports: list[RunReport]) -> RunReport:
        """One report of a command's passes (``up``'s): every host's tasks of every pass, in
        order; a host failed or unreachable in any pass is so in the whole."""
        if len(reports) == 1:
            return reports[0]
        out = cls(check_mode=reports[0].check_mode, started=reports[0].started)
        for r in reports:
            for name, h in r.hosts.items():
                mine = out.host(name)
                mine.tasks += h.tasks
                mine.unreachable = mine.unreachable or h.unreachable
                mine.failed = mine.failed or h.failed
            out.finished = r.finished
        return out

    @property
    def ok(self) -> bool:
        return not any(h.failed or h.unreachable for h in self.hosts.values())

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def totals(self) -> dict[str, int]:
        total = {s.value: 0 for s in Status}
        for h in self.hosts.values():
            for k, v in h.counts().items():
                total[k] += v
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "check_mode": self.check_mode,
            "duration_s": round((self.finished or time.time()) - self.started, 3),
            "ok": self.ok,
            "totals": self.totals(),
            "hosts": {name: h.to_json() for name, h in self.hosts.items()},
        }
