"""The simulated NVIDIA packages, inspected as built .debs with dpkg-deb -I/-f/-c."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from deployer.gpu import matrix
from deployer.lab.gpusim import build_packages, catalog


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    paths = build_packages(tmp_path_factory.mktemp("debs"))
    return {p.name: p for p in paths}


def field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def contents(deb: Path) -> dict[str, str]:
    """path -> mode string of every member."""
    out = subprocess.run(
        ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    members = {}
    for line in out.splitlines():
        parts = line.split()
        members[parts[5].removeprefix(".")] = parts[0]
    return members


def member_text(deb: Path, member: str) -> str:
    proc = subprocess.run(f"dpkg-deb --fsys-tarfile {deb} | tar -xOf - .{member}", shell=True,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return proc.stdout


DRIVERS = ["535.54.03", "570.133.20", "580.65.06", "580.126.20", "595.45.04"]


@pytest.mark.parametrize("version", DRIVERS)
@pytest.mark.parametrize(
    "package",
    ["nvidia-open", "cuda-drivers", "nvidia-driver", "nvidia-driver-cuda", "nvidia-smi",
     "libnvidia-ml1", "libcuda1", "nvidia-persistenced", "nvidia-kernel-dkms",
     "nvidia-kernel-open-dkms"],
)  # fmt: skip
def test_every_branch_has_the_driver_packages_at_the_repo_version(
    debs, package: str, version: str
) -> None:
    deb = debs[f"{package}_{version}-1_amd64.deb"]
    assert field(deb, "Package") == package
    assert field(deb, "Version") == f"{version}-1"


def test_branches_on_both_sides_of_the_cuda_13_boundary_are_present(debs) -> None:
    branches = {n.split("_")[1].split(".")[0] for n in debs if n.startswith("nvidia-open_")}
    assert {"535", "570"} <= branches  # CUDA 12
    assert {"580", "595"} <= branches  # CUDA 13


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nvidia-fabricmanager-535_535.54.03-1_amd64.deb", "nvidia-fabricmanager-535"),
        ("nvidia-fabricmanager-570_570.133.20-1_amd64.deb", "nvidia-fabricmanager-570"),
        ("nvidia-fabricmanager_580.65.06-1_amd64.deb", "nvidia-fabricmanager"),
        ("nvidia-fabricmanager_595.45.04-1_amd64.deb", "nvidia-fabricmanager"),
    ],
)
def test_fabric_manager_is_named_per_branch_at_the_driver_version(
    debs, name: str, expected: str
) -> None:
    deb = debs[name]
    assert field(deb, "Package") == expected
    assert field(deb, "Version") == name.split("_")[1]
    assert "/usr/bin/nv-fabricmanager" in contents(deb)
    assert "/usr/lib/systemd/system/nvidia-fabricmanager.service" in contents(deb)


def test_no_unversioned_fabric_manager_below_580(debs) -> None:
    assert not [
        n for n in debs if n.startswith("nvidia-fabricmanager_5") and n.split("_")[1] < "580"
    ]


@pytest.mark.parametrize(
    ("branch", "exists"), [("535", False), ("570", False), ("580", True), ("595", True)]
)
def test_pinning_packages_exist_for_the_new_packaging_branches(
    debs, branch: str, exists: bool
) -> None:
    found = [n for n in debs if n.startswith(f"nvidia-driver-pinning-{branch}_")]
    assert bool(found) is exists


def test_the_pinning_package_pins_its_branch(debs) -> None:
    deb = debs["nvidia-driver-pinning-580_580.126.20-1_all.deb"]
    text = member_text(deb, "/etc/apt/preferences.d/nvidia-driver-pinning-580")
    assert "Pin: version 580.*" in text
    assert "nvidia-open" in text and "cuda-drivers" in text


@pytest.mark.parametrize(
    ("name", "dependency"),
    [
        ("nvidia-open_580.65.06-1_amd64.deb", "nvidia-kernel-open-dkms (= 580.65.06-1)"),
        ("nvidia-open_580.65.06-1_amd64.deb", "nvidia-driver (= 580.65.06-1)"),
        ("cuda-drivers_570.133.20-1_amd64.deb", "nvidia-kernel-dkms (= 570.133.20-1)"),
        ("nvidia-smi_595.45.04-1_amd64.deb", "libnvidia-ml1 (= 595.45.04-1)"),
        ("nvidia-driver-cuda_535.54.03-1_amd64.deb", "nvidia-persistenced (= 535.54.03-1)"),
        (
            "datacenter-gpu-manager-4-cuda12_4.4.2-1_amd64.deb",
            "datacenter-gpu-manager-4-core (= 1:4.4.2-1)",
        ),
        (
            "datacenter-gpu-manager-4-cuda13_4.5.3-1_amd64.deb",
            "datacenter-gpu-manager-4-core (= 1:4.5.3-1)",
        ),
        (
            "datacenter-gpu-manager-exporter_4.8.2-1_amd64.deb",
            "datacenter-gpu-manager-4-core (>= 1:4.0.0)",
        ),
    ],
)
def test_dependencies_are_those_of_the_real_packages(debs, name: str, dependency: str) -> None:
    assert dependency in [d.strip() for d in field(debs[name], "Depends").split(",")]


@pytest.mark.parametrize("dcgm", ["4.4.2", "4.5.3"])
@pytest.mark.parametrize("package", ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12",
                                     "datacenter-gpu-manager-4-cuda13"])  # fmt: skip
def test_dcgm_packages_carry_the_epoch(debs, package: str, dcgm: str) -> None:
    assert field(debs[f"{package}_{dcgm}-1_amd64.deb"], "Version") == f"1:{dcgm}-1"


def test_dcgm_core_conflicts_with_dcgm_3_and_cuda_variants_provide_the_virtual(debs) -> None:
    assert "datacenter-gpu-manager" in field(
        debs["datacenter-gpu-manager-4-core_4.4.2-1_amd64.deb"], "Conflicts"
    )
    assert (
        field(debs["datacenter-gpu-manager-4-cuda13_4.4.2-1_amd64.deb"], "Provides")
        == "datacenter-gpu-manager-4"
    )


def test_kernel_module_flavours_exclude_each_other(debs) -> None:
    for name in (
        "nvidia-kernel-dkms_580.65.06-1_amd64.deb",
        "nvidia-kernel-open-dkms_580.65.06-1_amd64.deb",
    ):
        assert "nvidia-kernel-dkms-any" in field(debs[name], "Conflicts")
        assert "nvidia-kernel-dkms-any (= 580.65.06-1)" in field(debs[name], "Provides")


@pytest.mark.parametrize(
    ("name", "paths"),
    [
        ("nvidia-smi_580.65.06-1_amd64.deb", ["/usr/bin/nvidia-smi"]),
        ("nvidia-persistenced_580.65.06-1_amd64.deb",
         ["/usr/bin/nvidia-persistenced", "/usr/lib/systemd/system/nvidia-persistenced.service"]),
        ("datacenter-gpu-manager-4-core_4.4.2-1_amd64.deb",
         ["/usr/bin/nv-hostengine", "/usr/bin/dcgmi", "/usr/lib/systemd/system/nvidia-dcgm.service"]),
        ("datacenter-gpu-manager-exporter_4.7.1-1_amd64.deb",
         ["/usr/bin/dcgm-exporter", "/etc/dcgm-exporter/default-counters.csv",
          "/usr/lib/systemd/system/nvidia-dcgm-exporter.service"]),
        ("nvidia-kernel-open-dkms_595.45.04-1_amd64.deb",
         ["/usr/lib/systemd/system/gpusim-nvidia-module.service", "/usr/libexec/gpusim/nvidia-module-load"]),
    ],
)  # fmt: skip
def test_programs_and_units_are_at_the_real_paths(debs, name: str, paths: list[str]) -> None:
    members = contents(debs[name])
    for p in paths:
        assert p in members
    for p in paths:
        if p.startswith("/usr/bin/"):
            assert members[p].startswith("-rwxr-xr-x")


def test_dcgm_unit_runs_the_hostengine_as_the_real_one_does(debs) -> None:
    unit = member_text(debs["datacenter-gpu-manager-4-core_4.5.3-1_amd64.deb"],
                       "/usr/lib/systemd/system/nvidia-dcgm.service")  # fmt: skip
    assert "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm" in unit
    assert "Alias=dcgm.service" in unit


def test_exporter_unit_and_counters_are_the_upstream_ones(debs) -> None:
    deb = debs["datacenter-gpu-manager-exporter_4.8.2-1_amd64.deb"]
    unit = member_text(deb, "/usr/lib/systemd/system/nvidia-dcgm-exporter.service")
    assert "ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv" in unit
    assert "After=nvidia-dcgm.service" in unit
    csv = member_text(deb, "/etc/dcgm-exporter/default-counters.csv")
    enabled = [
        line.split(",")[0].strip()
        for line in csv.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(enabled) == 26
    assert {
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DRIVER_VERSION",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    } <= set(enabled)
    conffiles = subprocess.run(["dpkg-deb", "-I", str(deb), "conffiles"], capture_output=True, text=True,
                               check=True).stdout  # fmt: skip
    assert "/etc/dcgm-exporter/default-counters.csv" in conffiles


def test_the_lab_kernels_headers_stand_in_holds_what_dkms_tests_for(debs) -> None:
    # the lab's hosts run the lab machine's kernel, which no Debian archive has headers for; the
    # nvidia_driver role installs linux-headers-<kernel> before the driver (DKMS builds against it)
    import platform

    release = platform.release()
    deb = debs[f"linux-headers-{release}_{catalog.HEADERS_VERSION}_amd64.deb"]
    assert field(deb, "Package") == f"linux-headers-{release}"
    assert f"/lib/modules/{release}/build/include/GPUSIM-STAND-IN" in contents(deb)
    assert field(deb, "Depends") == ""  # no driver package depends on it, as NVIDIA's do not


def test_a_later_kernels_headers_stand_in_is_there_for_a_kernel_installed_after_the_driver(
    debs,
) -> None:
    # a lab test puts that kernel on a host (an unattended upgrade); the nvidia_driver role then
    # installs its headers, whose postinst has the simulated DKMS build the module for it
    later = catalog.later_kernel(catalog.lab_kernel())
    assert later != catalog.lab_kernel()
    deb = debs[f"linux-headers-{later}_{catalog.HEADERS_VERSION}_amd64.deb"]
    assert f"/lib/modules/{later}/build/include/GPUSIM-STAND-IN" in contents(deb)
    assert "a later kernel, never booted" in field(deb, "Description")
    postinst = subprocess.run(["dpkg-deb", "-I", str(deb), "postinst"], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
    assert f"run-parts --report --exit-on-error --arg={later} /etc/kernel/header_postinst.d" in (
        postinst
    )


def test_a_vagrant_box_kernels_headers_stand_in_is_built_when_asked() -> None:
    names = {d.name for d in catalog.all_packages(("6.1.0-41-amd64",))}
    assert "linux-headers-6.1.0-41-amd64" in names
    assert "linux-headers-6.1.0-41-amd64" not in {d.name for d in catalog.all_packages()}
    # the lab machine's own kernel is not built twice
    lab = catalog.lab_kernel()
    assert [d.name for d in catalog.all_packages((lab,))].count(f"linux-headers-{lab}") == 1


@pytest.mark.parametrize(
    ("release", "later"),
    [("6.18.44-fc-v1272", "6.18.45-fc-v1272"), ("6.1.0-28-amd64", "6.1.1-28-amd64"),
     ("5.15.0", "5.15.1")],
)  # fmt: skip
def test_the_later_kernel_is_newer_as_dkms_compares_kernels(release, later) -> None:
    from deployer.facts import newest_kernel

    assert catalog.later_kernel(release) == later
    assert newest_kernel(release, [release, later]) == later


def test_the_mirror_is_rebuilt_for_another_kernel(monkeypatch) -> None:
    from deployer.lab import mirror

    here = mirror.gpusim_digest()
    monkeypatch.setattr("platform.release", lambda: "6.1.0-99-amd64")
    assert mirror.gpusim_digest() != here


def test_every_package_says_it_is_simulated(debs) -> None:
    for deb in debs.values():
        assert field(deb, "Description").startswith("SIMULATED ")


def test_every_executable_says_it_is_simulated(debs) -> None:
    text = member_text(debs["nvidia-smi_580.65.06-1_amd64.deb"], "/usr/bin/nvidia-smi")
    assert text.startswith("#!/usr/bin/python3\n# SIMULATED nvidia-smi")


def test_building_twice_gives_identical_bytes(tmp_path: Path, debs) -> None:
    again = build_packages(tmp_path)
    assert len(again) == len(debs)
    for p in again:
        assert (
            hashlib.sha256(p.read_bytes()).digest()
            == hashlib.sha256(debs[p.name].read_bytes()).digest()
        )


@pytest.mark.parametrize("release", catalog.DRIVERS, ids=[d.version for d in catalog.DRIVERS])
def test_every_driver_package_the_matrix_names_is_simulated(release) -> None:
    # the matrix (deployer/data/compat.yml) and the simulated repository agree on the names,
    # e.g. nvidia-driver-570-open for open modules on R570
    m = matrix.matrix()
    names = m.packages_for(m.driver_packages, str(release.branch)).names
    fmt = {"branch": release.branch, "version": release.version}
    wanted = {n.format(**fmt) for n in (*names["open"], *names["proprietary"])}
    if names.get("pinning"):
        wanted.add(names["pinning"].format(**fmt))
    built = {d.name for d in catalog.driver_packages(release)}
    assert wanted <= built, wanted - built
