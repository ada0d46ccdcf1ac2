"""The rows of ``gpumon-deploy status``: one ``Check`` per thing checked, in one of three states.

- ``ok``: checked and as expected;
- ``pending``: cannot be known yet and expected to settle by itself (a replica that just started
  and has not scraped a target since; a daemon still starting up) -- not a failure, not green;
- ``failed``: checked and wrong; the detail names the host and what is wrong.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

OK, PENDING, FAILED = "ok", "pending", "failed"
_RANK = {OK: 0, PENDING: 1, FAILED: 2}


@dataclass(frozen=True)
class Check:
    component: str
    host: str
    check: str
    state: str  # OK | PENDING | FAILED
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state == OK

    @staticmethod
    def of(component: str, host: str, check: str, ok: bool, detail: str = "") -> Check:
        return Check(component, host, check, OK if ok else FAILED, detail)


def worst(states: list[str]) -> str:
    return max(states, key=_RANK.__getitem__, default=OK)


def clock(epoch: float) -> str:
    """A host's timestamp as people read it in a table: UTC, seconds."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def parse_time(text: str) -> float | None:
    """A Prometheus/Alertmanager API timestamp (RFC 3339, up to nanoseconds) as epoch seconds;
    None for Go's zero time ``0001-01-01T00:00:00Z`` (never happened) or anything unreadable."""
    if not text or text.startswith("0001-01-01"):
        return None
    t = text.replace("Z", "+00:00")
    if "." in t:
        head, rest = t.split(".", 1)
        digits = len(rest) - len(rest.lstrip("0123456789"))
        t = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        return None


# ---------------------------------------------------------------- the rows shown


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.state == FAILED]


def pending(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.state == PENDING]


def overall(checks: list[Check]) -> str:
    return worst([c.state for c in checks])


def _row(c: Check) -> dict[str, Any]:
    return {**asdict(c), "ok": c.ok}


def to_json(checks: list[Check]) -> dict[str, Any]:
    """``{"ok", "state", "checks", "failed", "pending"}``; each check ``{"component", "host",
    "check", "state", "detail", "ok"}`` (``ok``: state is "ok")."""
    return {
        "ok": overall(checks) == OK,
        "state": overall(checks),
        "checks": [_row(c) for c in checks],
        "failed": [_row(c) for c in failures(checks)],
        "pending": [_row(c) for c in pending(checks)],
    }


def table(checks: list[Check]) -> str:
    shown = {OK: "ok", PENDING: "PENDING", FAILED: "FAILED"}
    rows = [("COMPONENT", "HOST", "CHECK", "RESULT", "DETAIL")] + [
        (c.component, c.host, c.check, shown[c.state], c.detail) for c in checks
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows)
