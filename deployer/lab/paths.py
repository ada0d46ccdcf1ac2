"""Where the lab keeps its state (per lab) and its caches (shared by every lab on the machine)."""

from __future__ import annotations

import os
from pathlib import Path

STATE_ROOT_ENV = "GPUMON_LAB_STATE_DIR"
CACHE_ROOT_ENV = "GPUMON_LAB_CACHE_DIR"
DEFAULT_STATE_ROOT = Path("/var/lib/gpumon-lab")
DEFAULT_CACHE_ROOT = Path("/var/cache/gpumon-lab")


def state_root() -> Path:
    """Parent of every lab's state directory (``$GPUMON_LAB_STATE_DIR`` overrides)."""
    return Path(os.environ.get(STATE_ROOT_ENV) or DEFAULT_STATE_ROOT)


def cache_root() -> Path:
    """Downloads, the base root filesystem and the built mirror; never inside the repository."""
    return Path(os.environ.get(CACHE_ROOT_ENV) or DEFAULT_CACHE_ROOT)


def write_secret(path: Path, data: bytes | str) -> None:
    """Write a file readable by its owner only (0600), created with that mode from the start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, raw)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by a rename, so that a reader sees the old content or the new, never an
    empty or half-written file (the lab's state files are read while their writer runs)."""
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    staged.replace(path)
