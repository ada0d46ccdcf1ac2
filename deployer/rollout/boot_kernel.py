"""Which kernel a GPU host's reboot boots, asked before the rollout touches it.

A host whose boot loader starts an installed kernel DKMS builds no NVIDIA module for (neither
the running nor the newest one) would come back from the rollout's reboot without its driver:
its validation fails, and it stays drained. So the rollout's preflight reads the boot loader
(``deployer/modules/boot_loader.py``: what is read and how it is judged, shared with the
nvidia_driver role's check before an install) in the round trip that asks the host's package
sources (``deployer/rollout/availability.py``), and refuses such a host (rule ``boot-kernel``,
exit 2, nothing drained, silenced or stopped; also in ``--check``). An entry that cannot be told
without ``grub.cfg`` is a note.
"""

from __future__ import annotations

from deployer.gpu.rules import Refusal
from deployer.modules import boot_loader
from deployer.modules.boot_loader import FIX, BootLoader

RULE = "boot-kernel"


def judge(
    host: str, boot: BootLoader, running: str | None, newest: str | None
) -> tuple[Refusal | None, str | None]:
    """(a refusal, a note) for a host whose boot loader starts a kernel DKMS builds no NVIDIA
    module for."""
    problem, note = boot_loader.judge(boot, running, newest)
    if problem is None:
        return None, note
    return (
        Refusal(
            host,
            RULE,
            f"its reboot {problem}: the host would come back without its driver",
            f"{FIX}; nothing was drained, silenced or stopped",
        ),
        None,
    )
