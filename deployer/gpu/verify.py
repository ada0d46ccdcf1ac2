"""Verification of a converged GPU host against its resolved plan.

``verify(resolved, observed) -> list[Mismatch]``
    After converge: compare a host's observed versions (``ObservedVersions``, from facts) with
    the resolved plan and the matrix: reboot required, wrong driver / flavour / Fabric Manager /
    DCGM version or CUDA variant / exporter version, exporter older than the host's DCGM, GPUs of
    another model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deployer.gpu.matrix import EXPORTER_TAG_RE, model_from_gpu_name, version_key
from deployer.gpu.rules import ResolvedPlan

# --------------------------------------------------------------------------------------------
# Verification of a converged host
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservedVersions:
    """What facts found on a host. Versions may carry an epoch or Debian revision; None = absent.

    ``driver_smi`` is None when nvidia-smi failed (e.g. "Driver/library version mismatch").
    ``exporter_version`` may be a tag (``4.5.3-4.8.2``) or the package's exporter version.
    ``module_flavour`` is ``open``/``proprietary`` (from ``modinfo -F license nvidia``).
    """

    driver_installed: str | None = None
    driver_loaded: str | None = None
    driver_smi: str | None = None
    module_flavour: str | None = None
    dcgm_version: str | None = None
    dcgm_packages: tuple[str, ...] = ()
    exporter_version: str | None = None
    fabricmanager_version: str | None = None
    gpu_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mismatch:
    """A difference between a host's observed state and its resolved plan."""

    host: str
    rule: str
    message: str
    fix: str
    expected: str | None
    observed: str | None

    def __str__(self) -> str:
        return f"{self.host}: {self.message}; {self.fix} [{self.rule}]"


def upstream_version(version: str | None) -> str | None:
    """Strip a Debian epoch and revision: ``1:4.5.3-1`` -> ``4.5.3``."""
    if version is None:
        return None
    v = version.strip()
    if ":" in v:
        v = v.split(":", 1)[1]
    return v.split("-", 1)[0] or None


def verify(resolved: ResolvedPlan, observed: ObservedVersions) -> list[Mismatch]:
    """Differences between what facts found and what the plan resolved to."""
    host = resolved.host
    out: list[Mismatch] = []

    def add(rule: str, message: str, fix: str, expected: str | None, seen: str | None) -> None:
        out.append(Mismatch(host, rule, message, fix, expected, seen))

    want = resolved.driver_version
    installed = upstream_version(observed.driver_installed)
    loaded = upstream_version(observed.driver_loaded)
    smi = upstream_version(observed.driver_smi)
    if installed != want:
        add(
            "driver-version",
            f"driver package {installed or 'not installed'}, planned {want}",
            "run the nvidia_driver role",
            want,
            installed,
        )
    if installed and loaded != installed:
        add(
            "reboot-required",
            f"loaded driver {loaded or 'none'} differs from the installed {installed}",
            "reboot the host (or reload the nvidia modules)",
            installed,
            loaded,
        )
    elif loaded and smi != loaded:
        add(
            "driver-smi",
            f"nvidia-smi reports {smi or 'an error'} but the loaded module is {loaded}",
            "reboot the host (user-space and kernel module disagree)",
            loaded,
            smi,
        )
    if observed.module_flavour and observed.module_flavour != resolved.module_flavour:
        add(
            "module-flavour",
            f"{observed.module_flavour} kernel modules loaded, planned {resolved.module_flavour}",
            f"install the {resolved.module_flavour} driver packages and reboot",
            resolved.module_flavour,
            observed.module_flavour,
        )
    if resolved.nvswitch:
        fm = upstream_version(observed.fabricmanager_version)
        if fm != want or (installed and fm != installed):
            driver = installed if installed and installed != want else want
            add(
                "fabricmanager-version",
                f"Fabric Manager {fm or 'not installed'}, must equal the driver {driver}"
                + ("" if driver == want else f" (planned {want})"),
                f"install {resolved.fabricmanager_package}={want} together with the driver",
                want,
                fm,
            )
    dcgm = upstream_version(observed.dcgm_version)
    if dcgm != resolved.dcgm_version:
        add(
            "dcgm-version",
            f"DCGM {dcgm or 'not installed'}, planned {resolved.dcgm_version}",
            "run the dcgm role",
            resolved.dcgm_version,
            dcgm,
        )
    if resolved.dcgm_cuda_variant is not None and observed.dcgm_packages:
        expected = next(p for p in resolved.dcgm_packages if re.search(r"-cuda\d+$", p))
        wrong = sorted(
            p for p in observed.dcgm_packages if re.search(r"-cuda\d+$", p) and p != expected
        )
        if expected not in observed.dcgm_packages or wrong:
            found = ", ".join(wrong) or "none"
            add(
                "dcgm-package-variant",
                f"CUDA {resolved.cuda_major} driver (R{resolved.driver_branch}) needs "
                f"{expected}, not {found}",
                f"install {expected} and remove {found}",
                expected,
                found,
            )
    seen_exporter = observed.exporter_version
    if seen_exporter is not None:
        tag_match = EXPORTER_TAG_RE.match(seen_exporter.strip())
        if tag_match:
            exp_dcgm, exp_version = tag_match.group(1), tag_match.group(2)
        else:
            exp_dcgm, exp_version = None, upstream_version(seen_exporter)
        if exp_version != resolved.exporter_version or (
            exp_dcgm is not None and exp_dcgm != resolved.exporter_dcgm_version
        ):
            add(
                "exporter-version",
                f"dcgm-exporter {seen_exporter.strip()}, planned {resolved.exporter_tag}",
                "run the dcgm_exporter role",
                resolved.exporter_tag,
                seen_exporter,
            )
        if exp_dcgm is not None and dcgm and version_key(exp_dcgm) < version_key(dcgm):
            add(
                "exporter-dcgm-older",
                f"dcgm-exporter is built on DCGM {exp_dcgm}, older than the host's DCGM {dcgm}",
                "install an exporter built on the host's DCGM or later",
                dcgm,
                exp_dcgm,
            )
    else:
        add(
            "exporter-version",
            f"dcgm-exporter not installed, planned {resolved.exporter_tag}",
            "run the dcgm_exporter role",
            resolved.exporter_tag,
            None,
        )
    for name in observed.gpu_names:
        model = model_from_gpu_name(name)
        if model != resolved.gpu_model:
            add(
                "gpu-model",
                f"GPU {name!r} is {model or 'an unknown model'}, planned {resolved.gpu_model}",
                "correct gpu_model in the inventory",
                resolved.gpu_model,
                name,
            )
            break
    return out
