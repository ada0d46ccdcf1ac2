"""What a GPU host's reboot will boot, asked before the rollout touches it: which kernel, and
whether that kernel will load the module DKMS signs.

A host whose boot loader starts an installed kernel DKMS builds no NVIDIA module for (neither
the running nor the newest one) would come back from the rollout's reboot without its driver:
its validation fails, and it stays drained. So the rollout's preflight reads the boot loader
(``deployer/modules/boot_loader.py``: what is read and how it is judged, shared with the
nvidia_driver role's check before an install) in the round trip that asks the host's package
sources (``deployer/rollout/availability.py``), and refuses such a host (rule ``boot-kernel``,
exit 2, nothing drained, silenced or stopped; also in ``--check``). An entry that cannot be told
without ``grub.cfg`` is a note. In the same round trip, a host under UEFI Secure Boot whose DKMS
signing certificate is not enrolled (``deployer/modules/module_signing.py``) is refused (rule
``module-signing``): the kernel would reject the new module.
"""

from __future__ import annotations

from deployer.gpu.rules import Refusal
from deployer.modules import boot_loader, module_signing
from deployer.modules.boot_loader import FIX, BootLoader

RULE = "boot-kernel"
SIGNING_RULE = "module-signing"


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


def judge_signing(host: str, signing: module_signing.Signing) -> tuple[Refusal | None, str | None]:
    """(a refusal, a note) for a host under Secure Boot whose kernel would reject the module
    DKMS signs."""
    problem, note = module_signing.judge(signing)
    if problem is None:
        return None, note
    return (
        Refusal(
            host,
            SIGNING_RULE,
            f"it {problem}: its kernel would reject the new module at the rollout's reboot, and "
            "the host would come back without its driver",
            f"{module_signing.fix(signing.cert)}; nothing was drained, silenced or stopped",
        ),
        None,
    )
