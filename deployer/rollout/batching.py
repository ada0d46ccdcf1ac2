"""Batch arithmetic of a rolling upgrade: canary, batch sizes, --max-unavailable, --max-failures.

Pure functions, unit-tested table-driven. ``N`` or ``P%`` amounts: a percentage is of the hosts
selected for the run (the GPU hosts ``--limit`` leaves), rounded up, and never below 1 -- 25% of 3
hosts is 1 host, as Kubernetes scales ``maxUnavailable``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from deployer.errors import InputError

_AMOUNT = re.compile(r"^\s*(\d+)\s*(%?)\s*$")


@dataclass(frozen=True)
class Amount:
    value: int
    percent: bool = False

    @classmethod
    def parse(cls, text: str | int, key: str) -> Amount:
        m = _AMOUNT.match(str(text))
        if not m:
            raise InputError(f"{text!r} is not a count (2) or a percentage (25%)", key=key)
        value, percent = int(m.group(1)), bool(m.group(2))
        if value < 1 or (percent and value > 100):
            raise InputError(
                f"{text!r} must be at least 1{' and at most 100%' if percent else ''}", key=key
            )
        return cls(value, percent)

    def of(self, total: int) -> int:
        """The number of hosts this amount means out of ``total``."""
        if not self.percent:
            return self.value
        return max(1, math.ceil(total * self.value / 100))

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def plan_batches(hosts: Sequence[str], canary: int, batch_size: int) -> list[list[str]]:
    """The canary batch (``canary`` hosts; none when 0) then batches of ``batch_size``."""
    if canary < 0 or batch_size < 1:
        raise ValueError("canary must be >= 0 and batch_size >= 1")
    out: list[list[str]] = []
    first = list(hosts[:canary])
    if first:
        out.append(first)
    rest = list(hosts[len(first) :])
    out.extend(rest[i : i + batch_size] for i in range(0, len(rest), batch_size))
    return out


def room(max_unavailable: int, out_of_service: Iterable[str]) -> int:
    """How many more hosts may be taken out of service now."""
    return max(0, max_unavailable - len(set(out_of_service)))


@dataclass(frozen=True)
class Step:
    """What the controller does next within a batch: start ``start``; stop the run when
    ``stop_reason`` is set; with neither, wait for a running host to finish and judge again."""

    start: list[str]  # hosts to run now (interrupted ones first, then fresh ones)
    stop_reason: str | None = None  # set only when nothing runs and no fresh host may start


def next_hosts(
    interrupted: Sequence[str],
    fresh: Sequence[str],
    *,
    running: Iterable[str] = (),
    out_of_service: Iterable[str],
    max_unavailable: int,
    failures: int,
    max_failures: int,
) -> Step:
    """The next decision within a batch, judged on the state of this moment.

    ``interrupted`` hosts (left mid-step by an earlier controller; already out of service) always
    continue. Fresh hosts start as far as --max-unavailable leaves room, counting every host out of
    service now plus the hosts being driven (``running``, and the interrupted ones started with
    this step), but a fresh host already out of service needs no room -- none once
    --max-failures is reached. A limit reached while hosts of this run are
    still being driven is a wait, not a stop: they may come back and free their places, and the
    controller asks again when one finishes. The run stops only when no host is being driven and
    still no fresh host may start: the places are held by hosts nothing in this run brings back
    (drained or unreachable before the run, failed and left drained)."""
    start = list(interrupted)
    if not fresh:
        return Step(start)
    busy = set(running) | set(interrupted)
    if failures >= max_failures:
        if busy:
            return Step(start)
        return Step(
            start,
            f"--max-failures {max_failures} reached ({failures} failed): no new host is started",
        )
    down = set(out_of_service) | busy
    # A fresh host out of service already (drained before the run by someone else, or by an
    # earlier run this one takes over) takes no new place: driving it leaves no more hosts out
    # of service than there are now. So a Kubernetes DaemonSet's rolling update replaces an
    # unavailable old pod outside maxUnavailable, still counting it as unavailable
    # (kubernetes/kubernetes pkg/controller/daemon/update.go, rollingUpdate's
    # ``allowedReplacementPods``). The places are for the hosts in service.
    already = [h for h in fresh if h in down]
    in_service = [h for h in fresh if h not in down]
    free = room(max_unavailable, down)
    if free == 0 and not already:
        if busy:
            return Step(start)
        return Step(
            start,
            f"--max-unavailable {max_unavailable} reached: {len(down)} host(s) out of service "
            f"({', '.join(sorted(down))})",
        )
    return Step(start + already + in_service[:free])
