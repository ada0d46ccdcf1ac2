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

How df is asked and its answer judged is the ``disk_space`` module's
(deployer/modules/disk_space.py), which the nvidia_driver role also runs before it installs
anything, so ``up`` fails a host short of room before its install. The role's defaults
(``roles/nvidia_driver/defaults/main.yml``) are estimates, not measured on NVIDIA's packages
here: docs/unverified.md#nvidia-driver-install-space.
"""

from __future__ import annotations

from collections.abc import Iterable

from deployer.gpu.gpu_plan import ROOM_HINT
from deployer.gpu.rules import Refusal
from deployer.modules import disk_space

RULE = "disk-space"
MARK = "@@ free space"


def script(paths: Iterable[str]) -> str:
    """Read-only shell: the free space of ``paths``, one line each (``path free mount``) after
    :data:`MARK` (``disk_space.df_command``); a path the host lacks prints nothing. Nothing
    without paths."""
    command = disk_space.df_command(paths)
    return f"echo '{MARK}'; {command}\n" if command else ""


def refusal(host: str, short: list[str]) -> Refusal:
    return Refusal(
        host,
        RULE,
        "too little free space for the driver's install: " + "; ".join(short),
        f"{ROOM_HINT}; nothing was drained, silenced or stopped",
    )
