"""Whether a GPU host has room for its driver install, asked before any host is touched.

A driver install that runs out of space fails half-way: dpkg stops unpacking with its package
half-installed (``/usr``), DKMS fails to build the module (``/var/lib/dkms``), or
``update-initramfs`` fails in a package's trigger (``/boot``, a small partition that old kernels
fill), and dpkg leaves the package unconfigured. ``upgrade-driver`` would have drained, silenced
and stopped the host by then: a node out of service with a broken package state. apt itself
checks only the downloads' room in ``/var/cache/apt/archives``.

So the rollout's preflight reads, in the round trip that asks the host's package sources
(``deployer/rollout/availability.py``), the free space of each path of
``nvidia_driver_min_free_mib`` (``df --output``: the space an unprivileged user may take, and the
mount point, by which paths on one filesystem are told), and refuses the run (exit 2, nothing
drained, silenced or stopped) where a filesystem has less free than the needs of its paths
together. Also in ``--check``: the free space is read, not predicted. A path the host does not
have is not asked.

The role's defaults (``roles/nvidia_driver/defaults/main.yml``) are estimates, not measured on
NVIDIA's packages here: docs/unverified.md#nvidia-driver-install-space.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deployer.gpu.gpu_plan import FREE_SPACE_VAR
from deployer.gpu.rules import Refusal

RULE = "disk-space"
MARK = "@@ free space"
MIB = 1 << 20


@dataclass(frozen=True)
class Room:
    """The filesystem holding one path, as ``df`` saw it: its mount point and the bytes an
    unprivileged user may still write there."""

    mount: str
    free_bytes: int


def script(paths: Iterable[str]) -> str:
    """Read-only shell: the free space of ``paths``, one line each (``path free mount``) after
    :data:`MARK`, in the C locale; a path the host lacks prints nothing. Nothing without paths."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    if not quoted:
        return ""
    return f"echo '{MARK}'; LC_ALL=C df -B1 --output=file,avail,target -- {quoted} 2>/dev/null\n"


def parse(lines: Iterable[str]) -> dict[str, Room]:
    """Path -> Room from :func:`script`'s lines after its mark (df's header, or a line of
    another shape, is passed over)."""
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


def refusal(host: str, short: list[str]) -> Refusal:
    return Refusal(
        host,
        RULE,
        "too little free space for the driver's install: " + "; ".join(short),
        "free space there (apt-get clean empties /var/cache/apt/archives; old kernels fill "
        f"/boot), or set {FREE_SPACE_VAR} for the host where its install needs less; nothing "
        "was drained, silenced or stopped",
    )
