"""One changing run per inventory on a controller.

Two operators who start ``up`` (or ``upgrade-driver``, ``restore``, ``targets``) against the
same inventory at once would interleave on the same hosts: one restarting the replica the other
counts on as its HA partner, one pass of a TLS rotation or a re-shard settled by the other's, a
targets file of a hand-over overwritten. So a command
that changes hosts takes an exclusive ``flock`` for its whole life on a lock file named by the
inventory's real path (``$GPUMON_LOCK_DIR``, else ``$XDG_STATE_HOME/gpumon-deploy/locks``, 0700;
the file 0600 and holding who has it), and a second one is refused at once, with exit 2, naming
the holder, before it reads a fact or writes anything. The kernel drops the lock when the holder
exits, however it ends (killed included), so nothing stale is left to clean up. Read-only
commands (``check``, ``status``, ``facts``, ``--check``) take no lock.

What it does not see: a run from another controller, or of another file listing the same hosts.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from deployer.controller_secrets import state_home
from deployer.errors import InputError

LOCK_DIR_ENV = "GPUMON_LOCK_DIR"


def lock_dir() -> Path:
    given = os.environ.get(LOCK_DIR_ENV)
    return Path(given) if given else state_home() / "locks"


def lock_path(inventory: str | Path) -> Path:
    """The lock file of ``inventory`` (a file or directory), by its real path."""
    real = os.path.realpath(os.path.expanduser(str(inventory)))
    return lock_dir() / f"{hashlib.sha256(real.encode()).hexdigest()[:20]}.lock"


@contextlib.contextmanager
def exclusive(path: Path, holder: str, refused: Callable[[str], Exception]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made 0600, never followed as a link) while the
    block runs, ``holder`` written in it meanwhile and emptied after. When another process has
    it: ``refused(what that holder wrote)`` is raised at once, before the block (so an error the
    block raises is never taken for the lock's). The kernel drops the lock when the holder
    exits, killed or not. Also the lock of a rollout's run directory (deployer/rollout/state.py)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise refused(os.pread(fd, 512, 0).decode("utf-8", "replace").strip()) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # the file stays (removing it would race a new holder)
    finally:
        os.close(fd)  # closing the last descriptor drops the lock


@contextlib.contextmanager
def changing(inventory: str | Path, command: str) -> Iterator[None]:
    """Hold the inventory's lock while the block runs ``command``; another holder is an
    InputError naming it."""
    path = lock_path(inventory)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    def refused(other: str) -> InputError:
        return InputError(
            f"another gpumon-deploy run is changing the hosts of this inventory "
            f"({other or 'holder unknown'}; lock {path}): let it finish, then run again",
            source=str(inventory),
        )

    with exclusive(path, f"{command}, pid {os.getpid()}, since {started}\n", refused):
        yield
