"""Secrets generated on the controller, kept there 0600: a role's password nobody chose.

``controller_secret(path)`` returns the secret kept in ``path`` (a file of its own, one line),
creating it at first use with 32 random URL-safe characters, in a directory created 0700; a file
that others can read is refused rather than used. Every value returned is registered as a
secret (``deployer/secrets.py``), so it is masked in every output. Like Ansible's
``lookup('password', ...)``, the file is created when the plan is built, in check mode too, so a
check run and the run after it agree on the value.

``write_private`` and ``read_private`` are the files' two ends for every private file the
controller keeps (keys, password records): written atomically with the mode set before any byte,
refused when others can read them. They live here, not beside the CA, so that reading a
rotation record does not import the X.509 stack.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from deployer.errors import InputError
from deployer.secrets import register_secret

ENV = "GPUMON_SECRETS_DIR"
LENGTH_BYTES = 24  # 32 URL-safe characters


def state_home() -> Path:
    """The product's state on the controller: $XDG_STATE_HOME/gpumon-deploy (by default
    ~/.local/state/gpumon-deploy)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpumon-deploy"


def default_dir() -> str:
    """$GPUMON_SECRETS_DIR, else $XDG_STATE_HOME/gpumon-deploy/secrets."""
    configured = os.environ.get(ENV)
    if configured:
        return configured
    return str(state_home() / "secrets")


def controller_secret(path: str | os.PathLike[str]) -> str:
    p = Path(path).expanduser()
    if not p.is_absolute():
        raise InputError(f"secret file must be an absolute path, got {str(path)!r}")
    try:
        value = _read(p)
    except FileNotFoundError:
        value = _create(p)
    register_secret(value)
    return value


def _read(p: Path) -> str:
    value = read_private(p, 4096, " (or delete it to have a new secret generated)")
    value = value.decode("utf-8").strip()
    if not value:
        raise InputError(f"{p} is empty: delete it to have a new secret generated")
    return value


def _create(p: Path) -> str:
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    value = secrets.token_urlsafe(LENGTH_BYTES)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another run created it meanwhile: use that one
        return _read(p)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (value + "\n").encode("utf-8"))
    finally:
        os.close(fd)
    return value


def write_private(path: Path, data: bytes, mode: int) -> None:
    """Atomically: a temporary file in the same directory, ``mode`` before any byte, renamed.
    The directory is made (0700) when it is missing: a private file lives in a private one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_private(path: Path, limit: int = 1 << 20, or_else: str = "") -> bytes:
    """A private file's bytes (at most ``limit``), refused when others can read it: the error
    says how to fix it, then ``or_else``. Never follows a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            raise InputError(
                f"{path} is readable by others (mode {mode:04o}): chmod 600 {path}{or_else}",
                source=str(path),
            )
        return os.read(fd, limit)
    finally:
        os.close(fd)
