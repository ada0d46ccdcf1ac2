"""Does NVML initialise on each GPU host, with the driver that is installed?

After a driver package change without a reboot, the kernel module still loaded is the old one and
every new NVML client fails: ``nvidia-smi`` prints ``Failed to initialize NVML: Driver/library
version mismatch`` and exits 18 (``gpu_reality_fixtures/driver-misc/nvidia-smi-mismatch.txt``),
and CUDA jobs fail to start. The exporters keep serving: nv-hostengine started before the change
still has the old library mapped, so the metrics (driver label included) look healthy and only
the host itself can tell. Status therefore reads it on the host, through the engine's own facts
(``deployer.facts``: nvidia-smi's answer, the installed package, the loaded module's
``/proc/driver/nvidia/version``), read-only, with no second parser.
"""

from __future__ import annotations

from deployer.facts import HostFacts
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
