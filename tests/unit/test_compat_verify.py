"""Specification of the after-converge check: observed versions against the resolved plan."""

from __future__ import annotations

import dataclasses

import pytest

from deployer.gpu.rules import resolve
from deployer.gpu.verify import ObservedVersions, upstream_version, verify
from deployer.gpu.version_plan import plan_from_vars

PLAN = resolve(
    plan_from_vars(
        "gpu01",
        {
            "gpu_model": "H100",
            "gpu_count": 8,
            "nvswitch": True,
            "nvidia_driver_branch": "580",
            "dcgm_version": "4.5.3",
            "dcgm_exporter_version": "4.5.3-4.8.2",
        },
    )
)

CONVERGED = ObservedVersions(
    driver_installed="580.126.20-1",
    driver_loaded="580.126.20",
    driver_smi="580.126.20",
    module_flavour="open",
    dcgm_version="1:4.5.3-1",
    dcgm_packages=("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda13"),
    exporter_version="4.5.3-4.8.2",
    fabricmanager_version="580.126.20-1",
    gpu_names=("NVIDIA H100 80GB HBM3",) * 8,
)


def observed(**changes):
    return dataclasses.replace(CONVERGED, **changes)


def test_converged_host_has_no_mismatch():
    assert verify(PLAN, CONVERGED) == []


def test_exporter_package_version_form_is_accepted():
    assert verify(PLAN, observed(exporter_version="4.8.2-1")) == []


MISMATCHES = [
    ("packages upgraded, old module loaded", dict(driver_loaded="580.65.06"), ["reboot-required"]),
    (
        "no module loaded after install",
        dict(driver_loaded=None, driver_smi=None),
        ["reboot-required"],
    ),
    ("nvidia-smi fails on library mismatch", dict(driver_smi=None), ["driver-smi"]),
    (
        "other driver installed and loaded",
        dict(driver_installed="580.65.06-1", driver_loaded="580.65.06", driver_smi="580.65.06"),
        ["driver-version", "fabricmanager-version"],
    ),
    (
        "driver missing",
        dict(driver_installed=None, driver_loaded=None, driver_smi=None),
        ["driver-version"],
    ),
    ("proprietary modules loaded", dict(module_flavour="proprietary"), ["module-flavour"]),
    (
        "fabric manager one release behind",
        dict(fabricmanager_version="580.65.06-1"),
        ["fabricmanager-version"],
    ),
    ("fabric manager missing", dict(fabricmanager_version=None), ["fabricmanager-version"]),
    ("DCGM older than planned", dict(dcgm_version="1:4.4.2-1"), ["dcgm-version"]),
    (
        "DCGM cuda12 variant on a CUDA 13 driver",
        dict(dcgm_packages=("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12")),
        ["dcgm-package-variant"],
    ),
    (
        "both DCGM variants installed",
        dict(
            dcgm_packages=(
                "datacenter-gpu-manager-4-core",
                "datacenter-gpu-manager-4-cuda12",
                "datacenter-gpu-manager-4-cuda13",
            )
        ),
        ["dcgm-package-variant"],
    ),
    ("exporter of another release", dict(exporter_version="4.5.3-4.8.1"), ["exporter-version"]),
    (
        "exporter of an older DCGM release",
        dict(exporter_version="4.4.2-4.7.1"),
        ["exporter-version", "exporter-dcgm-older"],
    ),
    ("exporter missing", dict(exporter_version=None), ["exporter-version"]),
    (
        "exporter built on a DCGM older than the host's",
        dict(dcgm_version="4.6.0", exporter_version="4.5.3-4.8.2"),
        ["dcgm-version", "exporter-dcgm-older"],
    ),
    ("GPUs of another model", dict(gpu_names=("NVIDIA H200",) * 8), ["gpu-model"]),
]


@pytest.mark.parametrize(("case", "changes", "rules"), MISMATCHES, ids=[c for c, *_ in MISMATCHES])
def test_mismatch_is_reported_by_its_rule(case, changes, rules):
    mismatches = verify(PLAN, observed(**changes))
    assert [m.rule for m in mismatches] == rules
    assert all(m.host == "gpu01" and m.fix for m in mismatches)


def test_cuda_variant_mismatch_message_names_both_packages():
    (m,) = verify(
        PLAN,
        observed(
            dcgm_packages=("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12")
        ),
    )
    assert m.message == (
        "CUDA 13 driver (R580) needs datacenter-gpu-manager-4-cuda13, "
        "not datacenter-gpu-manager-4-cuda12"
    )


def test_reboot_required_carries_installed_and_loaded_versions():
    (m,) = verify(PLAN, observed(driver_loaded="580.65.06"))
    assert (m.expected, m.observed) == ("580.126.20", "580.65.06")


def test_fabric_manager_is_not_checked_without_nvswitch():
    plan = resolve(
        plan_from_vars(
            "gpu03",
            {
                "gpu_model": "A100",
                "gpu_count": 4,
                "nvidia_driver_branch": "580",
                "dcgm_version": "4.5.3",
                "dcgm_exporter_version": "4.5.3-4.8.2",
            },
        )
    )
    seen = observed(fabricmanager_version=None, gpu_names=("NVIDIA A100-SXM4-80GB",) * 4)
    assert verify(plan, seen) == []


def test_volta_host_on_r580_expects_the_cuda12_variant():
    plan = resolve(
        plan_from_vars(
            "gpu04",
            {
                "gpu_model": "V100",
                "gpu_count": 8,
                "nvidia_driver_branch": "580",
                "dcgm_version": "4.5.3",
                "dcgm_exporter_version": "4.5.3-4.8.2",
            },
        )
    )
    seen = observed(
        module_flavour="proprietary",
        fabricmanager_version=None,
        dcgm_packages=("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"),
        gpu_names=("Tesla V100-SXM2-32GB",) * 8,
    )
    assert verify(plan, seen) == []


@pytest.mark.parametrize(
    ("raw", "upstream"),
    [
        ("1:4.5.3-1", "4.5.3"),
        ("580.126.20-1", "580.126.20"),
        ("580.126.20", "580.126.20"),
        ("4.8.2-1", "4.8.2"),
        (None, None),
    ],
)
def test_upstream_version_strips_epoch_and_revision(raw, upstream):
    assert upstream_version(raw) == upstream
