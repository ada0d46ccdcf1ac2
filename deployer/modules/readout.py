"""Helpers for read scripts that report several things: ``@section`` markers and their parsing."""

from __future__ import annotations

import hashlib

from deployer.connection import CommandResult


def sections(stdout: str) -> dict[str, str]:
    """Split a read's output at ``@name`` lines (lines before the first marker are dropped)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith("@") and "=" not in line:
            current = out.setdefault(line[1:], [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def as_result(stdout: str) -> CommandResult:
    """A section's text as a CommandResult, for parsers written against whole read results."""
    return CommandResult("", 0, stdout, "")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
