"""``disk_space``: a read-only check that the filesystems of some paths have room for what a
role is about to install; it reads and never reports a change.

``needs`` maps absolute paths to the MiB the install writes under each. ``df`` (coreutils, the C
locale) tells each path's filesystem (its mount point) and the bytes an unprivileged user may
still write there; paths on one filesystem need the sum of their needs, and a path the host does
not have is not asked. A filesystem short of it fails the task with ``purpose`` and ``hint`` in
the message, before anything is installed: an install that runs out of space stops half-way
(dpkg leaves a package half-installed or unconfigured, DKMS builds no module, ``update-initramfs``
fails in a trigger), which a later run cannot simply repeat.

The same reading serves ``upgrade-driver``'s preflight (deployer/rollout/free_space.py), which
asks it in the round trip that asks the hosts' package sources, before any host is drained.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from deployer.connection import CommandResult
from deployer.modules.base import (
    ArgError,
    HostSession,
    Observation,
    Param,
    ReadOnlyCheck,
    register,
)

MIB = 1 << 20
# A path df is asked about: absolute, of these characters only (no quoting surprises)
PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")


@dataclass(frozen=True)
class Room:
    """The filesystem holding one path, as ``df`` saw it: its mount point and the bytes an
    unprivileged user may still write there."""

    mount: str
    free_bytes: int


def df_command(paths: Iterable[str]) -> str:
    """Read-only shell: ``path free mount`` of each of ``paths`` after df's header, in the C
    locale; a path the host lacks prints nothing; exits 0 either way. Empty without paths."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    if not quoted:
        return ""
    return f"LC_ALL=C df -B1 --output=file,avail,target -- {quoted} 2>/dev/null; true"


def parse(lines: Iterable[str]) -> dict[str, Room]:
    """Path -> Room from :func:`df_command`'s lines (df's header, or a line of another shape,
    is passed over)."""
    rooms = {}
    for line in lines:
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1].isdigit():
            rooms[parts[0]] = Room(parts[2], int(parts[1]))
    return rooms


def shortfalls(needs: Mapping[str, int], rooms: Mapping[str, Room]) -> list[str]:
    """Each filesystem with less free than the needs (MiB) of the paths on it together, as
    ``path and path (on /): N MiB free, M MiB needed``. Paths without a Room are not asked."""
    on: dict[str, list[str]] = {}
    for path in needs:
        room = rooms.get(path)
        if room is not None:
            on.setdefault(room.mount, []).append(path)
    out = []
    for mount, paths in on.items():
        need = sum(needs[p] for p in paths)
        free = rooms[paths[0]].free_bytes
        if free < need * MIB:
            out.append(
                f"{' and '.join(paths)} (on {mount}): {free // MIB} MiB free, {need} MiB needed"
            )
    return out


@register
class DiskSpace(ReadOnlyCheck):
    """Room on the filesystems of ``needs``' paths; the task fails, saying where, when short."""

    name = "disk_space"
    params = {
        "needs": Param(dict, required=True),
        "purpose": Param(str, default="the install"),
        "hint": Param(str, default="free space there"),
    }

    def check(self, args: dict[str, Any]) -> None:
        for path, mib in args["needs"].items():
            if not isinstance(path, str) or not PATH.match(path):
                raise ArgError("needs", f"{path!r} is not an absolute path")
            if isinstance(mib, bool) or not isinstance(mib, int) or mib < 0:
                raise ArgError("needs", f"{path}: {mib!r} is not a whole number of MiB")

    def read_script(self, args: dict[str, Any]) -> str:
        return df_command(_asked(args)) or "true"

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return {"short": shortfalls(_asked(args), parse(result.stdout.splitlines()))}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"short": []}

    def explain(self, args: dict[str, Any], session: HostSession, obs: Observation) -> str:
        short = "; ".join(obs.actual.get("short") or ())
        return f"too little free space for {args['purpose']}: {short}; {args['hint']}"


def _asked(args: dict[str, Any]) -> dict[str, int]:
    """``needs`` without the paths at 0 (not asked)."""
    return {path: mib for path, mib in args["needs"].items() if mib}
