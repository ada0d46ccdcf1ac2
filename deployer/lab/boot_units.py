"""A oneshot unit the lab writes into a host's root before it boots, enabled at sysinit (as
``systemctl enable`` would link it): the SIMULATED device nodes and PCI bus of a GPU host."""

from __future__ import annotations

import os
from pathlib import Path


def install(root: Path, unit: str, text: str, target: str = "sysinit.target") -> None:
    """Write ``unit`` into ``root``'s /etc/systemd/system and link it into ``target``'s wants."""
    path = Path(root) / "etc/systemd/system" / unit
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    wants = path.parent / f"{target}.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit
    if not link.is_symlink():
        link.unlink(missing_ok=True)
        os.symlink(f"/etc/systemd/system/{unit}", link)
