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
commands (``check``, ``status``, ``facts``, ``--check``) take no lock; ``status`` reads who holds
it (:func:`holder`) without taking it.

What it does not see: a run from another controller, or of another file listing the same hosts.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from deployer.controller_secrets import state_home
from deployer.errors import InputError

LOCK_DIR_ENV = "GPUMON_LOCK_DIR"
PROC_LOCKS = Path("/proc/locks")


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


def flock_held(path: Path, locks: Path = PROC_LOCKS) -> bool | None:
    """Whether a process holds a ``flock`` on ``path`` now, read from ``/proc/locks`` (the file's
    device and inode among its FLOCK entries), which takes nothing: trying the lock ourselves
    could turn away a run starting at the same moment. None where ``locks`` cannot be read."""
    try:
        text = locks.read_text()
    except OSError:
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in text.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 9001 fe:00:2342913 0 EOF": device major:minor in hex, then
        # the inode in decimal (as Debian 12's controller printed it for a flock taken by pid
        # 9001 on inode 2342913 of device 254:0; tests/unit/test_status_rollouts.py checks it on
        # the running kernel); blocked waiters ("1: -> FLOCK ...") hold nothing.
        words = line.split()
        if len(words) < 6 or words[1] != "FLOCK":
            continue
        major, minor, inode = [*words[5].split(":"), "", "", ""][:3]
        try:
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                return True
        except ValueError:
            continue
    return False


def holder(inventory: str | Path, locks: Path = PROC_LOCKS) -> str | None:
    """Who is changing the hosts of ``inventory`` now, as the holder wrote it (``up, pid N,
    since ...``); None when nobody is."""
    return held_by(lock_path(inventory), locks)


def held_by(path: Path, locks: Path = PROC_LOCKS) -> str | None:
    """What the process holding the ``flock`` on ``path`` wrote there (``holder unknown`` when
    it wrote nothing); None when nobody holds it. Where ``/proc/locks`` cannot be read, the pid
    the holder wrote (``cmd, pid N, ...``, or a bare pid: a rollout's lock,
    deployer/rollout/state.py) is checked for a live process: the file is emptied on release,
    but not by a holder that was killed."""
    held = flock_held(path, locks)
    if held is False:
        return None
    try:
        said = path.read_text().strip()
    except OSError:
        said = ""
    if held is None:
        pid = re.fullmatch(r"(\d+)", said) or re.search(r"\bpid (\d+)", said)
        return said if pid and Path(f"/proc/{pid[1]}").exists() else None
    return said or "holder unknown"
