"""Does NVML initialise on each GPU host, with the driver that is installed?

After a driver package change without a reboot, the kernel module still loaded is the old one and
every new NVML client fails: ``nvidia-smi`` prints ``Failed to initialize NVML: Driver/library
version mismatch`` and exits 18 (``gpu_reality_fixtures/driver-misc/nvidia-smi-mismatch.txt``),
and CUDA jobs fail to start. The exporters keep serving: nv-hostengine started before the change
still has the old library mapped, so the metrics (driver label included) look healthy and only
the host itself can tell. Status therefore reads it on the host, through the engine's own facts
(``deployer.facts``: nvidia-smi's answer, the installed package, the loaded module's
``/proc/driver/nvidia/version``), read-only, with no second parser.

A second row per GPU host asks whether the next boot will load that driver at all
(:func:`module_check`): the module on disk for the kernel that boot starts, read as the driver
role reads it before a reboot (``deployer.modules.driver_module``), one more round trip.
"""

from __future__ import annotations

from deployer.facts import HostFacts
from deployer.modules import driver_module
from deployer.modules.driver_module import HostRead
from deployer.monitoring.check import FAILED, OK, Check

COMPONENT = "driver"
CHECK = "NVML: loaded driver = installed"


def _versions(f: HostFacts) -> str:
    return (
        f"installed {f.driver_installed or '?'}, kernel module loaded {f.driver_loaded or '?'}"
        + (f", nvidia-smi {f.driver_smi}" if f.driver_smi else "")
    )


def driver_check(host: str, facts: HostFacts | None, error: str | None) -> Check:
    """One row per GPU host: failed naming the host when NVML cannot initialise or the loaded
    module is not the installed driver."""
    if facts is None:
        return Check(COMPONENT, host, CHECK, FAILED, f"cannot read the host over SSH: {error}")
    if facts.nvidia_smi == "absent":
        return Check(COMPONENT, host, CHECK, FAILED, "nvidia-smi not installed: no NVIDIA driver")
    if facts.nvidia_smi == "error":
        message = (facts.nvidia_smi_error or "").strip().splitlines()
        said = message[0] if message else "failed"
        if facts.nvml_mismatch:
            return Check(
                COMPONENT,
                host,
                CHECK,
                FAILED,
                f"NVML version mismatch: nvidia-smi: {said} ({_versions(facts)})"
                + (
                    f", user-space NVML {facts.nvml_library_version}"
                    if facts.nvml_library_version
                    else ""
                )
                + ": "
                "CUDA jobs fail until the host is rebooted (gpumon-deploy upgrade-driver "
                "drains and reboots)",
            )
        return Check(COMPONENT, host, CHECK, FAILED, f"nvidia-smi: {said} ({_versions(facts)})")
    if facts.reboot_required:
        return Check(
            COMPONENT,
            host,
            CHECK,
            FAILED,
            f"driver versions differ ({_versions(facts)}): reboot owed",
        )
    return Check(
        COMPONENT,
        host,
        CHECK,
        OK,
        f"{facts.driver_smi or facts.driver_loaded}, {len(facts.gpus)} GPU(s) listed by nvidia-smi",
    )


MODULE_CHECK = "next boot has the driver's module"


def reads_modules(facts: HostFacts) -> bool:
    """Whether status reads the next boot's module on this host (:func:`module_check` judges):
    a driver installed, on a host :func:`_unjudged` does not rule out."""
    return bool(facts.driver_installed) and _unjudged(facts) is None


def _unjudged(facts: HostFacts) -> str | None:
    """Why the next boot's module is not judged on this host, None where it is: it is read as
    Debian's dkms and GRUB lay it out, against the running kernel."""
    if not facts.kernel:
        return "the running kernel could not be read"
    if facts.os_family != "debian":
        return (
            f"{facts.os_id or 'this OS'} is not of the Debian family, whose dkms and GRUB "
            "layout are what is read"
        )
    return None


def driver_rows(
    host: str,
    facts: HostFacts | None,
    error: str | None,
    modules: tuple[HostRead | None, str | None],
) -> list[Check]:
    """A GPU host's driver rows: NVML's, then the next boot's module (where judged)."""
    module = module_check(host, facts, *modules)
    return [driver_check(host, facts, error), *([module] if module is not None else [])]


def module_check(
    host: str, facts: HostFacts | None, read: HostRead | None, error: str | None
) -> Check | None:
    """Will the host's next boot load the installed driver? The NVIDIA module of the installed
    driver must be on disk for the kernel that boot starts (``deployer.modules.driver_module``,
    the check the driver role asks before it reboots, judged here on every run): a kernel
    installed after the driver -- an unattended upgrade, an administrator's ``apt upgrade`` --
    without its headers, or with DKMS's autoinstall off, gets no module, and the host runs fine
    until a reboot (its own, a power cut, a rollout's) brings it back with no driver. None (no
    row) where there is nothing to judge: the host not read (the NVML row says why) or no driver
    installed (the NVML row fails)."""
    if facts is None or facts.driver_installed is None:
        return None
    version = facts.driver_installed
    unjudged = _unjudged(facts)
    if unjudged is not None:
        return Check(COMPONENT, host, MODULE_CHECK, OK, f"not judged: {unjudged}")
    if read is None:
        return Check(COMPONENT, host, MODULE_CHECK, FAILED, f"cannot read: {error}")
    judged = driver_module.verdict(
        read.boot, read.modules, version, facts.kernel, facts.newest_kernel or None
    )
    if judged.problem is not None:
        return Check(
            COMPONENT, host, MODULE_CHECK, FAILED,
            f"driver {version} is installed, but the host's next boot starts {judged.problem}; "
            "until then a reboot (an operator's, a power cut, a rollout's) brings it back "
            "without its driver",
        )  # fmt: skip
    # where GRUB's pick cannot be told (an entry by number without grub.cfg ...), say so
    return Check(
        COMPONENT, host, MODULE_CHECK, OK,
        f"kernel {judged.kernel} ({judged.how}) has driver {version}'s module on disk"
        + (f"; but {judged.note}" if judged.note else ""),
    )  # fmt: skip
