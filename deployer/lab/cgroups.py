"""One cgroup per lab host, so hosts do not share the cgroup tree systemd-nspawn hands them.

systemd-nspawn with ``--keep-unit`` on a machine without systemd puts the container below the
cgroup of the process that started it.  If every host is started from the root cgroup they all
get the same ``/payload`` subtree and their systemds race on it (units fail with
``219/CGROUP``).  Each host's supervisor therefore moves itself into
``<hierarchy>/gpumon-lab/<lab>/<host>`` in every hierarchy systemd uses, before starting nspawn.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "gpumon-lab"


def hierarchies() -> list[Path]:
    """The hierarchies systemd uses here: name=systemd and unified (hybrid) or the v2 root."""
    found = [
        p
        for p in (CGROUP_ROOT / "systemd", CGROUP_ROOT / "unified")
        if (p / "cgroup.procs").is_file()
    ]
    if not found and (CGROUP_ROOT / "cgroup.controllers").is_file():
        found = [CGROUP_ROOT]
    return found


def host_cgroup(lab: str, host: str) -> str:
    return f"{PREFIX}/{lab}/{host}"


def enter(relative: str) -> list[Path]:
    """Create ``relative`` in each hierarchy and move this process into it."""
    entered = []
    for hierarchy in hierarchies():
        path = hierarchy / relative
        path.mkdir(parents=True, exist_ok=True)
        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
        entered.append(path)
    return entered


def remove(relative: str) -> None:
    """Remove ``relative`` and everything below it (empty cgroups only), and empty parents
    up to the ``gpumon-lab`` directory."""
    for hierarchy in hierarchies():
        top = hierarchy / relative
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        parent = top.parent
        while (
            parent != hierarchy
            and parent.name != ""
            and str(parent).startswith(str(hierarchy / PREFIX))
        ):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = parent.parent
