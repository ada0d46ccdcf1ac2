"""Named time spans of one command, for the benches (bench/rollout.py), off unless asked for.

With ``GPUMON_SPANS=<file>`` in the environment, every ``with span(kind, host):`` records its
start and end (wall clock, seconds since the epoch) and, when the process exits, the spans are
written to ``<file>`` as JSON lines ``{"kind", "host", "start", "end"}``. Off, ``span`` returns
one shared context manager that does nothing: the cost is one global lookup and a call.

Kinds, by who spends the time (bench/rollout.py splits a run's wall time with them):
``remote`` (a command on a host, its round trip included), ``wait`` (a deliberate pause: a
reboot, a scrape the controller waits for), ``reboot``, ``http`` (a query to Prometheus while
validating) are the hosts' side; ``load`` (inventory, site, roles), ``plan``, ``connect``,
``state_write``, ``silence`` and ``step`` (one rollout step of one host, for the table) are the
controller's.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

ENV = "GPUMON_SPANS"
_records: list[tuple[str, str, float, float]] | None = None
_lock = threading.Lock()
F = TypeVar("F", bound=Callable[..., Any])


class _Off:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


OFF = _Off()


class _Span:
    __slots__ = ("host", "kind", "start")

    def __init__(self, kind: str, host: str) -> None:
        self.kind, self.host = kind, host
        self.start = 0.0

    def __enter__(self) -> None:
        self.start = time.time()

    def __exit__(self, *exc: object) -> bool:
        if _records is not None:
            _records.append((self.kind, self.host, self.start, time.time()))  # atomic (GIL)
        return False


def span(kind: str, host: str = "") -> _Span | _Off:
    """A context manager recording ``kind`` (and ``host``) when spans are on, else :data:`OFF`."""
    if _records is None:
        return OFF
    return _Span(kind, host)


def timed(kind: str, fn: F) -> F:
    """``fn`` itself when spans are off, else ``fn`` with each call recorded as ``kind``."""
    if _records is None:
        return fn

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _Span(kind, ""):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def enabled() -> bool:
    return _records is not None


def start(path: str) -> None:
    """Record from now on and write to ``path`` at exit (what ``GPUMON_SPANS`` does)."""
    global _records
    with _lock:
        if _records is None:
            _records = []
            atexit.register(write, path)


def recorded() -> list[dict[str, Any]]:
    return [{"kind": k, "host": h, "start": s, "end": e} for k, h, s, e in list(_records or [])]


def write(path: str) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for entry in recorded():
            out.write(json.dumps(entry) + "\n")


def stop() -> None:
    """Off again, nothing kept (tests)."""
    global _records
    _records = None


if os.environ.get(ENV):
    start(os.environ[ENV])
