"""Specification of what a compatible plan resolves to: versions, flavour, packages, pins."""

from __future__ import annotations

import pytest

from deployer.errors import PlanRefused
from deployer.gpu.rules import resolve
from deployer.gpu.version_plan import plan_from_vars


def resolved(**variables):
    variables.setdefault("gpu_count", 8)
    return resolve(plan_from_vars("gpu01", variables))


def apt(r, component):
    return [p.apt for p in r.packages(component)]


# --- driver --------------------------------------------------------------------------------


def test_a_branch_resolves_to_its_newest_known_version():
    r = resolved(gpu_model="H100", nvidia_driver_branch="580")
    assert (r.driver_branch, r.driver_version, r.driver_listed) == ("580", "580.126.20", True)


def test_an_unlisted_version_is_kept_and_noted():
    r = resolved(gpu_model="H100", nvidia_driver_version="580.82.07")
    assert (r.driver_version, r.driver_listed) == ("580.82.07", False)
    assert any("not listed" in n for n in r.notes)


@pytest.mark.parametrize(
    ("model", "version"),
    [("H100", "595.45.04"), ("V100", "580.126.20"), ("B200", "595.45.04")],
)
def test_default_driver_is_newest_ltsb_or_pb_version_the_gpu_supports(model, version):
    r = resolved(gpu_model=model)
    assert r.driver_version == version
    assert r.branch_type in ("LTSB", "PB")


def test_branch_designation_and_end_of_life_come_with_the_plan():
    r = resolved(gpu_model="H100", nvidia_driver_branch="535")
    assert (r.branch_type, r.branch_eol) == ("LTSB", "2026-06")


@pytest.mark.parametrize(
    ("branch", "cuda"), [("450", 11), ("535", 12), ("575", 12), ("580", 13), ("595", 13)]
)
def test_branch_gives_the_cuda_major(branch, cuda):
    assert resolved(gpu_model="A100", nvidia_driver_branch=branch).cuda_major == cuda


# --- kernel module flavour -----------------------------------------------------------------

FLAVOURS = [
    ("Hopper auto on R580 is open", dict(gpu_model="H100", nvidia_driver_branch="580"), "open"),
    (
        "Hopper auto before R560 is proprietary",
        dict(gpu_model="H100", nvidia_driver_branch="535"),
        "proprietary",
    ),
    (
        "Volta auto is proprietary",
        dict(gpu_model="V100", nvidia_driver_branch="580"),
        "proprietary",
    ),
    (
        "GH200 auto is open even before R560",
        dict(gpu_model="GH200", nvidia_driver_branch="535"),
        "open",
    ),
    ("Blackwell auto is open", dict(gpu_model="B200", nvidia_driver_branch="575"), "open"),
    (
        "explicit proprietary on Hopper is kept",
        dict(gpu_model="H100", nvidia_driver_branch="580", nvidia_module_flavour="proprietary"),
        "proprietary",
    ),
    (
        "explicit open on Ampere R535 is kept",
        dict(gpu_model="A100", nvidia_driver_branch="535", nvidia_module_flavour="open"),
        "open",
    ),
]


@pytest.mark.parametrize(("case", "variables", "flavour"), FLAVOURS, ids=[c for c, *_ in FLAVOURS])
def test_module_flavour(case, variables, flavour):
    assert resolved(**variables).module_flavour == flavour


# --- driver packages -----------------------------------------------------------------------

DRIVER_PACKAGES = [
    (
        "R580 open",
        dict(gpu_model="H100", nvidia_driver_branch="580"),
        ["nvidia-driver-pinning-580", "nvidia-open=580.126.20-1"],
    ),
    (
        "R580 proprietary",
        dict(gpu_model="V100", nvidia_driver_branch="580"),
        ["nvidia-driver-pinning-580", "cuda-drivers=580.126.20-1"],
    ),
    (
        "R575 open uses the new packaging",
        dict(gpu_model="B200", nvidia_driver_version="575.57.08"),
        ["nvidia-driver-pinning-575", "nvidia-open=575.57.08-1"],
    ),
    (
        "R535 proprietary is branch-suffixed",
        dict(gpu_model="V100", nvidia_driver_branch="535"),
        ["cuda-drivers-535=535.54.03-1"],
    ),
    (
        "R535 open is branch-suffixed",
        dict(gpu_model="A100", nvidia_driver_branch="535", nvidia_module_flavour="open"),
        ["nvidia-driver-535-open=535.54.03-1"],
    ),
]


@pytest.mark.parametrize(
    ("case", "variables", "packages"), DRIVER_PACKAGES, ids=[c for c, *_ in DRIVER_PACKAGES]
)
def test_driver_packages(case, variables, packages):
    assert apt(resolved(**variables), "driver") == packages


def test_pinning_package_is_named_only_where_one_exists():
    assert resolved(gpu_model="H100", nvidia_driver_branch="580").pinning_package == (
        "nvidia-driver-pinning-580"
    )
    assert resolved(gpu_model="H100", nvidia_driver_branch="535").pinning_package is None


# --- fabric manager ------------------------------------------------------------------------


def test_no_fabric_manager_without_nvswitch():
    r = resolved(gpu_model="A100", nvidia_driver_branch="580", nvswitch=False)
    assert (r.packages("fabricmanager"), r.fabricmanager_version) == ((), None)


@pytest.mark.parametrize(
    ("version", "packages"),
    [
        ("580.126.20", ["nvidia-fabricmanager=580.126.20-1", "libnvidia-nscq=580.126.20-1"]),
        (
            "570.133.20",
            ["nvidia-fabricmanager-570=570.133.20-1", "libnvidia-nscq-570=570.133.20-1"],
        ),
        ("535.54.03", ["nvidia-fabricmanager-535=535.54.03-1", "libnvidia-nscq-535=535.54.03-1"]),
    ],
)
def test_fabric_manager_is_exactly_the_driver_version_named_by_branch(version, packages):
    r = resolved(gpu_model="H100", nvswitch=True, nvidia_driver_version=version)
    assert apt(r, "fabricmanager") == packages
    assert r.fabricmanager_version == r.driver_version == version


# --- DCGM and exporter ---------------------------------------------------------------------

VARIANTS = [
    ("CUDA 13 driver", dict(gpu_model="H100", nvidia_driver_branch="580"), 13),
    ("CUDA 12 driver", dict(gpu_model="H100", nvidia_driver_branch="535"), 12),
    ("CUDA 11 driver", dict(gpu_model="A100", nvidia_driver_version="450.80.02"), 11),
    ("Volta on R580 takes cuda12", dict(gpu_model="V100", nvidia_driver_branch="580"), 12),
    ("Pascal on R580 takes cuda12", dict(gpu_model="P100", nvidia_driver_branch="580"), 12),
]


@pytest.mark.parametrize(("case", "variables", "cuda"), VARIANTS, ids=[c for c, *_ in VARIANTS])
def test_dcgm_cuda_variant(case, variables, cuda):
    r = resolved(**variables)
    assert r.dcgm_cuda_variant == cuda
    assert r.dcgm_packages == (
        "datacenter-gpu-manager-4-core",
        f"datacenter-gpu-manager-4-cuda{cuda}",
    )


def test_dcgm4_packages_are_pinned_with_epoch_and_replace_dcgm3():
    r = resolved(gpu_model="H100", nvidia_driver_branch="580", dcgm_version="4.4.2")
    assert apt(r, "dcgm") == [
        "datacenter-gpu-manager-4-core=1:4.4.2-1",
        "datacenter-gpu-manager-4-cuda13=1:4.4.2-1",
    ]
    assert r.remove == ("datacenter-gpu-manager", "datacenter-gpu-manager-config")


def test_dcgm3_is_one_package_and_has_no_native_exporter_package():
    r = resolved(
        gpu_model="A100",
        nvidia_driver_branch="535",
        dcgm_version="3.3.9",
        dcgm_exporter_version="3.3.9-3.6.1",
    )
    assert apt(r, "dcgm") == ["datacenter-gpu-manager=1:3.3.9"]
    assert (r.dcgm_major, r.dcgm_cuda_variant, r.remove) == (3, None, ())
    assert r.packages("exporter") == ()
    assert r.exporter_tag == "3.3.9-3.6.1"


DCGM_DEFAULTS = [
    ("neither set: newest tested pair", dict(), "4.6.0", "4.6.0-4.8.3"),
    (
        "exporter set: DCGM follows its tag",
        dict(dcgm_exporter_version="4.4.2-4.7.1"),
        "4.4.2",
        "4.4.2-4.7.1",
    ),
    (
        "DCGM set: newest exporter built on it or later",
        dict(dcgm_version="4.4.1"),
        "4.4.1",
        "4.6.0-4.8.3",
    ),
    (
        "both set: kept",
        dict(dcgm_version="4.4.1", dcgm_exporter_version="4.4.1-4.5.2"),
        "4.4.1",
        "4.4.1-4.5.2",
    ),
]


@pytest.mark.parametrize(
    ("case", "variables", "dcgm", "tag"), DCGM_DEFAULTS, ids=[c for c, *_ in DCGM_DEFAULTS]
)
def test_dcgm_and_exporter_defaults(case, variables, dcgm, tag):
    r = resolved(gpu_model="H100", nvidia_driver_branch="580", **variables)
    assert (r.dcgm_version, r.exporter_tag) == (dcgm, tag)


def test_exporter_package_is_versioned_by_the_exporter_part_of_the_tag():
    r = resolved(gpu_model="H100", nvidia_driver_branch="580", dcgm_exporter_version="4.5.3-4.8.2")
    assert (r.exporter_version, r.exporter_dcgm_version) == ("4.8.2", "4.5.3")
    assert apt(r, "exporter") == ["datacenter-gpu-manager-exporter=4.8.2-1"]


# --- install and hold lists ----------------------------------------------------------------


def test_install_order_is_pinning_driver_fabric_manager_dcgm_exporter():
    r = resolved(gpu_model="H100", nvswitch=True, nvidia_driver_branch="580")
    assert [p.component for p in r.install] == [
        "driver",
        "driver",
        "fabricmanager",
        "fabricmanager",
        "dcgm",
        "dcgm",
        "exporter",
    ]
    assert r.install[0].apt == "nvidia-driver-pinning-580"


def test_every_versioned_package_is_held_and_the_pinning_package_is_not():
    r = resolved(gpu_model="H100", nvswitch=True, nvidia_driver_branch="580")
    assert r.hold == (
        "nvidia-open",
        "nvidia-fabricmanager",
        "libnvidia-nscq",
        "datacenter-gpu-manager-4-core",
        "datacenter-gpu-manager-4-cuda13",
        "datacenter-gpu-manager-exporter",
    )


def test_lab_topology_resolves_without_versions_set():
    lab = {
        "gpu01": dict(gpu_model="H100", nvswitch=True),
        "gpu02": dict(gpu_model="H200", nvswitch=True),
        "gpu03": dict(gpu_model="A100", gpu_count=4),
        "gpu04": dict(gpu_model="V100"),
    }
    versions = {host: resolved(**v).driver_branch for host, v in lab.items()}
    assert versions == {"gpu01": "595", "gpu02": "595", "gpu03": "595", "gpu04": "580"}


def test_resolving_a_refused_plan_raises_plan_refused_with_the_rules():
    with pytest.raises(PlanRefused) as err:
        resolved(gpu_model="V100", nvidia_driver_branch="595")
    assert err.value.key == "gpu01"
    assert "[arch-last-branch]" in err.value.message
