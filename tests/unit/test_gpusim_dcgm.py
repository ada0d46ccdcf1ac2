"""The simulated nv-hostengine and dcgmi: a real TCP host engine on a free port, real dcgmi runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.gpu.dcgmi import diag_verdict, health_verdict
from deployer.lab.gpusim import apply_fault, build_packages, hardware_for, heal, prepare_root
from deployer.lab.gpusim.sandbox import Daemon, free_port, pick, run, unpack
from deployer.lab.gpusim.standins import dcgmi as standin_dcgmi
from deployer.lab.gpusim.standins.dcgmi import SYSTEM_NAMES
from tests.contract import dcgm_render as render

DRIVER_580 = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
              "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def host(tmp_path: Path, debs, *, dcgm="4.4.2", cuda="13", model="H100", driver=DRIVER_580) -> Path:
    root = tmp_path / "root"
    pkgs = [*driver, f"datacenter-gpu-manager-4-core_{dcgm}"]
    if cuda:
        pkgs.append(f"datacenter-gpu-manager-4-cuda{cuda}_{dcgm}")
    unpack(pick(debs, *pkgs), root)
    prepare_root(root, hardware_for(model, 8 if model != "A100" else 4, "gpu01", model == "H100"))
    return root


def engine(root: Path, port: int) -> Daemon:
    return Daemon(
        root,
        ["/usr/bin/nv-hostengine", "-n", "-p", str(port), "--pid", "/run/nvhostengine.pid"],
        port,
    )


def dcgmi(root: Path, port: int, *args: str):
    return run(root, ["/usr/bin/dcgmi", "--host", f"127.0.0.1:{port}", *args])


@pytest.fixture
def h100(tmp_path: Path, debs):
    root = host(tmp_path, debs)
    port = free_port()
    with engine(root, port):
        yield root, port


def test_discovery_lists_every_gpu_with_bus_id_and_uuid(h100) -> None:
    root, port = h100
    res = dcgmi(root, port, "discovery", "-l")
    assert res.returncode == 0
    assert res.stdout.startswith("8 GPUs found.\n")
    for g in hardware_for("H100", 8, "gpu01", True)["gpus"]:
        assert f"PCI Bus ID: {g['pci_bus_id']}" in res.stdout
        assert f"Device UUID: {g['uuid']}" in res.stdout
    assert "4 NvSwitches found." in res.stdout


def test_dcgm_4_4_keeps_listing_a_gpu_that_fell_off_the_bus(h100) -> None:
    # Query.cpp @v4.4.2 lists every GPU entity DCGM has; a lost GPU stays one
    root, port = h100
    apply_fault(root, "gpu-missing", {"gpu": 6})
    res = dcgmi(root, port, "discovery", "-l")
    assert res.stdout.startswith("8 GPUs found.\n")


def test_dcgm_4_5_lists_active_gpus_and_says_one_is_hidden(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, dcgm="4.5.3")
    port = free_port()
    lost = hardware_for("H100", 8, "gpu01", True)["gpus"][6]["uuid"]
    with engine(root, port):
        apply_fault(root, "gpu-missing", {"gpu": 6})
        active = dcgmi(root, port, "discovery", "-l").stdout
        every = dcgmi(root, port, "discovery", "-l", "-a").stdout
    assert active.startswith("7 GPUs found (Active).\nNote: Use -a flag to show all GPUs, "
                             "including those that are not active.\n")  # fmt: skip
    assert lost not in active
    assert every.startswith("8 GPUs found (All).\n")
    assert "| 6      | Status: LOST" in every
    assert f"Device UUID: {lost}" in every


def test_dcgm_4_5_counts_gpus_found_active(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, dcgm="4.5.3")
    port = free_port()
    with engine(root, port):
        res = dcgmi(root, port, "discovery", "-l")
    assert res.returncode == 0
    assert res.stdout.startswith("8 GPUs found (Active).\n+--------+---")


def test_health_is_healthy_without_faults(h100) -> None:
    root, port = h100
    assert dcgmi(root, port, "health", "-s", "a").returncode == 0
    res = dcgmi(root, port, "health", "-c")
    assert res.returncode == 0
    assert "| Overall Health            | Healthy" in res.stdout


@pytest.mark.parametrize(
    ("kind", "params", "system"),
    [
        ("ecc-dbe", {"gpu": 2}, "Memory"),
        ("gpu-missing", {"gpu": 1}, "ALL"),  # XID 79 is "devastating": any watch reports it
        ("xid", {"gpu": 0, "xid": 79}, "ALL"),
        ("xid", {"gpu": 0, "xid": 48}, "ALL"),
    ],
)
def test_health_reports_a_failure_and_still_exits_zero(h100, kind, params, system) -> None:
    # Health::CheckWatches returns DCGM_ST_OK whatever it found (Health.cpp:389-391 @v4.6.0)
    root, port = h100
    assert dcgmi(root, port, "health", "-s", "a").returncode == 0
    apply_fault(root, kind, params)
    res = dcgmi(root, port, "health", "-c", "-j")
    assert res.returncode == 0
    body = json.loads(res.stdout)["body"]
    assert body["Overall Health"]["value"] == "Failure"
    gpu = body["GPU"]["children"][str(params["gpu"])]
    assert gpu["value"] == "Failure"
    assert gpu["children"]["Errors"]["children"][SYSTEM_NAMES[system]]["value"] == "Failure"
    # the product reads the JSON as it reads the tree
    json_verdict = health_verdict(res.stdout, res.returncode)
    text = dcgmi(root, port, "health", "-c")
    assert json_verdict == health_verdict(text.stdout, text.returncode)
    assert not json_verdict.ok


# NVIDIA/DCGM dcgmi/tests/HealthTests.cpp:207-234 @v4.6.0 (tests/contract/test_dcgm_render.py)
NVIDIA_SCENARIO = [
    {"gpu": 0, "system": "Memory", "health": "Warning",
     "message": "The car is red? Are you sure because that doesn't seem like the color I ordered."},
    {"gpu": 1, "system": "Memory", "health": "Failure", "message": "Green can be emerald and "
     "beautiful, but there are shades of green which are sure to disappoint."},
    {"gpu": 1, "system": "SM", "health": "Warning",
     "message": "The guards wear Kholin blue because otherwise they'd be lame."},
]  # fmt: skip


@pytest.mark.parametrize("incidents", [NVIDIA_SCENARIO, NVIDIA_SCENARIO[:1], []])
def test_health_text_and_json_are_what_the_port_of_dcgms_printing_code_prints(incidents) -> None:
    """The simulator's ``dcgmi health -c [-j]`` against tests/contract/dcgm_render.py, the port
    of NVIDIA/DCGM v4.6.0's printing code, for the incidents of NVIDIA's own test."""
    ported = [render.Incident(i["gpu"], SYSTEM_NAMES[i["system"]], i["health"], i["message"])
              for i in incidents]  # fmt: skip
    text, overall = standin_dcgmi.health_report(incidents)
    assert text == render.health_tree(ported)
    assert standin_dcgmi.health_json(incidents, overall) == render.health_json(ported)


def test_from_dcgm_4_5_a_lost_gpu_is_left_out_of_the_health_check(tmp_path: Path, debs) -> None:
    """DCGM 4.5.0 checks only the group's active entities (modules/health/DcgmHealthWatch.cpp,
    EntityListOption::ActiveOnly); 4.4.2 (the case above) reported the GPU fallen off the bus."""
    root = host(tmp_path, debs, dcgm="4.5.3")
    port = free_port()
    with engine(root, port):
        assert dcgmi(root, port, "health", "-s", "a").returncode == 0
        apply_fault(root, "gpu-missing", {"gpu": 1})
        res = dcgmi(root, port, "health", "-c")
    assert res.returncode == 0
    assert "| Overall Health            | Healthy" in res.stdout


def test_the_health_text_is_dcgms_tree(h100) -> None:
    root, port = h100
    dcgmi(root, port, "health", "-s", "a")
    apply_fault(root, "ecc-dbe", {"gpu": 2, "count": 3})
    lines = dcgmi(root, port, "health", "-c").stdout.splitlines()
    assert lines[:9] == [
        "+---------------------------+----------------------------------------------------------+",
        "| Health Monitor Report                                                                |",
        "+===========================+==========================================================+",
        "| Overall Health            | Failure                                                  |",
        "| GPU                       |                                                          |",
        "| -> 2                      | Failure                                                  |",
        "|    -> Errors              |                                                          |",
        "|       -> Memory system    | Failure                                                  |",
        "|                           | Detected 3 volatile double-bit ECC error(s) in GPU 2.    |",
    ]
    assert lines[-1] == lines[0]
    assert all(len(line) == 88 for line in lines)


def test_health_check_before_any_watch_is_an_error(h100) -> None:
    root, port = h100
    res = dcgmi(root, port, "health", "-c")
    assert res.returncode == 253  # DCGM_ST_GENERIC_ERROR (Health.cpp:383-387)
    assert res.stdout == "Error: Health watches not enabled. Please enable watches. \n"


def test_a_hot_gpu_is_a_warning_not_a_failure(h100) -> None:
    root, port = h100
    dcgmi(root, port, "health", "-s", "a")
    apply_fault(root, "gpu-temp", {"gpu": 3, "value": 91})
    res = dcgmi(root, port, "health", "-c")
    assert res.returncode == 0
    assert "| Overall Health            | Warning" in res.stdout
    assert "|       -> Thermal system   | Warning" in res.stdout


def test_a_watch_not_set_is_not_reported(h100) -> None:
    root, port = h100
    dcgmi(root, port, "health", "-s", "p")
    apply_fault(root, "ecc-dbe", {"gpu": 2})
    assert "| Overall Health            | Healthy" in dcgmi(root, port, "health", "-c").stdout


@pytest.mark.parametrize("level", ["1", "2"])
def test_diag_passes_on_a_healthy_host(h100, level: str) -> None:
    root, port = h100
    res = dcgmi(root, port, "diag", "-r", level)
    assert res.returncode == 0, res.stdout
    assert "| Driver Version Detected   | 580.65.06" in res.stdout
    assert "Fail" not in res.stdout


@pytest.mark.parametrize(
    ("kind", "params", "level", "failing_test", "status"),
    [
        ("upgrade-validation", {}, "1", "software", 226),  # DCGM_ST_NVVS_ERROR
        ("upgrade-validation", {"test": "pcie", "gpu": 4}, "2", "pcie", 226),
        ("ecc-dbe", {"gpu": 2}, "1", "software", 226),  # a pending row remap: reset priority
        ("ecc-dbe", {"gpu": 2}, "2", "memory", 205),  # a volatile DBE: DCGM_ST_NVVS_ISOLATE_ERROR
        ("gpu-missing", {"gpu": 0}, "1", "software", 205),  # fallen off the bus: isolate
    ],
)
def test_diag_fails_when_the_fault_is_set(h100, kind, params, level, failing_test, status) -> None:
    # Diag::GetFailureResult (dcgmi/Diag.cpp:248-293 @v4.6.0)
    root, port = h100
    apply_fault(root, kind, params)
    res = dcgmi(root, port, "diag", "-r", level, "-j")
    assert res.returncode == status
    result = json.loads(res.stdout)
    tests = [t for c in result["DCGM Diagnostic"]["test_categories"] for t in c["tests"]]
    failed = {t["name"] for t in tests if t["test_summary"]["status"] == "Fail"}
    assert failing_test in failed


def test_diag_json_is_laid_out_as_dcgms_diag_prints_it(h100) -> None:
    """Diag::HelperJsonBuildOutput (dcgmi/Diag.cpp:1056-1288 @v4.6.0): a volatile DBE on GPU 2 at
    level 2, DCGM_FR_VOLATILE_DBE_DETECTED (4, severity ISOLATE 2, category HARDWARE_MEMORY 10:
    dcgmlib/src/dcgm_errors.c), reported on GPU 2's result and in the test's summary."""
    root, port = h100
    apply_fault(root, "ecc-dbe", {"gpu": 2})
    res = dcgmi(root, port, "diag", "-r", "2", "-j")
    assert res.returncode == 205
    assert res.stdout.startswith('{\n\t"DCGM Diagnostic" : \n\t{\n')  # jsoncpp's styled writer
    out = json.loads(res.stdout)
    assert sorted(out) == ["DCGM Diagnostic", "entity_groups", "metadata"]
    assert out["metadata"] == {"Driver Version Detected": "580.65.06", "version": "4.4.2"}
    (group,) = out["entity_groups"]
    assert (group["entity_group"], group["entity_group_id"]) == ("GPU", 1)
    assert [e["entity_id"] for e in group["entities"]] == list(range(8))
    assert all(sorted(e) == ["device_id", "entity_id", "serial_num"] for e in group["entities"])
    categories = out["DCGM Diagnostic"]["test_categories"]
    assert [c["category"] for c in categories] == ["Deployment", "Hardware", "Integration"]
    memory = next(t for c in categories for t in c["tests"] if t["name"] == "memory")
    dbe = {"warning": "Detected 1 volatile double-bit ECC error(s) in GPU 2.", "error_id": 4,
           "error_category": 10, "error_severity": 2}  # fmt: skip
    assert memory["test_summary"] == {"status": "Fail", "warnings": [dbe]}
    assert memory["results"][2] == {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 2,
                                    "status": "Fail", "warnings": [dbe]}  # fmt: skip
    assert memory["results"][0] == {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
                                    "status": "Pass"}  # fmt: skip


def test_a_validation_failure_on_a_test_outside_the_level_does_not_fail_it(h100) -> None:
    root, port = h100
    apply_fault(root, "upgrade-validation", {"test": "memory"})
    assert dcgmi(root, port, "diag", "-r", "1").returncode == 0
    assert dcgmi(root, port, "diag", "-r", "2").returncode == 226


def test_heal_makes_diag_pass_again(h100) -> None:
    root, port = h100
    apply_fault(root, "upgrade-validation", {})
    assert dcgmi(root, port, "diag", "-r", "1").returncode == 226
    heal(root)
    assert dcgmi(root, port, "diag", "-r", "1").returncode == 0


def test_diag_needs_the_cuda_variant_of_the_driver(tmp_path: Path, debs) -> None:
    """Only -cuda12 beside driver 580 (CUDA 13.0) on Hopper: nvvs cannot load the plugins of
    CUDA 13 (NVIDIA/DCGM nvvs/include/TestFramework.inl:574-579 @v4.6.0), which reaches dcgmi as
    the response's system error under DCGM_ST_NVVS_ERROR (modules/diag/DcgmDiagManager.cpp:
    1186-1189; dcgmi/Diag.cpp:436-465)."""
    root = host(tmp_path, debs, cuda="12")
    port = free_port()
    with engine(root, port):
        res = dcgmi(root, port, "diag", "-r", "1")
        grouped = dcgmi(root, port, "diag", "-r", "1", "-g", "0")
        as_json = dcgmi(root, port, "diag", "-r", "1", "-j")
    assert res.returncode == 226  # DCGM_ST_NVVS_ERROR, -30
    assert res.stdout == (
        "Error: Unable to complete diagnostic for entities *,cpu:*. Return: (-30) : DCGM GPU "
        "Diagnostic returned an error\nError: Cannot load plugins. Unable to change to the plugin "
        "dir '/usr/libexec/datacenter-gpu-manager-4/plugins/cuda13/': 'No such file or "
        "directory'\n"
    )
    assert grouped.stdout.startswith("Error: Unable to complete diagnostic for group 0. Return:")
    # with -j the same message as DCGM's JSON (Diag::HelperDisplayFailureMessage, Diag.cpp:633)
    assert as_json.returncode == 226
    assert json.loads(as_json.stdout) == {
        "DCGM Diagnostic": {"runtime_error": res.stdout.rstrip("\n"), "version": "4.4.2"}
    }
    # the product's verdict names the exit status and the plugin directory
    verdict = diag_verdict(res.stdout, res.returncode)
    assert not verdict.ok


def test_volta_on_580_uses_the_cuda12_variant(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, cuda="12", model="V100",
                driver=tuple(p.replace("open-dkms", "dkms") for p in DRIVER_580))  # fmt: skip
    port = free_port()
    with engine(root, port):
        assert dcgmi(root, port, "diag", "-r", "1").returncode == 0


def test_dcgmi_without_a_host_engine_cannot_connect(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    res = dcgmi(root, free_port(), "discovery", "-l")
    assert res.returncode == 235  # DCGM_ST_CONNECTION_NOT_VALID (dcgmi/Command.cpp:83-105)
    assert res.stdout.endswith("Error: Unable to connect to host engine. Host engine connection "
                               "invalid/disconnected.\n")  # fmt: skip


def test_an_upgraded_dcgmi_against_the_old_engine_connects_and_the_old_engine_answers(
    tmp_path: Path, debs
) -> None:
    """DCGM has no release handshake (dcgmlib/src/DcgmClientHandler.cpp:274-284 @v4.6.0): the
    new dcgmi lists the GPUs the old engine still runs on, in its own release's layout, and
    ``dcgmi -v`` tells the two builds apart (docs/unverified.md#dcgm-version-skew)."""
    root = host(tmp_path, debs)
    port = free_port()
    with engine(root, port):
        unpack(pick(debs, "datacenter-gpu-manager-4-core_4.5.3"), root)
        res = dcgmi(root, port, "discovery", "-l")
        version = dcgmi(root, port, "-v")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("8 GPUs found (Active).\n")  # 4.5's layout (dcgmi/Query.cpp)
    local, _, engine_side = version.stdout.partition("Hostengine build info:")
    assert "Version : 4.5.3" in local
    assert "Version : 4.5.3" not in engine_side and "Version : 4." in engine_side


def test_an_installed_stand_in_runs_its_own_package_s_code_even_where_the_source_is_importable(
    tmp_path: Path, debs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-ins import their package's own copy of the shared code (and its build.json),
    never the source tree's: with ``deployer`` importable (PYTHONPATH), the old engine read
    its version off the disk once the upgrade was unpacked, and ``dcgmi -v`` showed the new
    build for the old engine."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    root = host(tmp_path, debs)
    port = free_port()
    with engine(root, port):
        unpack(pick(debs, "datacenter-gpu-manager-4-core_4.5.3"), root)
        res = dcgmi(root, port, "-v")
    assert res.returncode == 0, res.stdout + res.stderr
    local, _, engine_side = res.stdout.partition("Hostengine build info:")
    assert "Version : 4.5.3" in local
    assert "Version : 4.5.3" not in engine_side and "Version : 4." in engine_side


@pytest.mark.parametrize("dcgm", ["4.4.2", "4.5.3"])
def test_versions_are_reported(tmp_path: Path, debs, dcgm: str) -> None:
    root = host(tmp_path, debs, dcgm=dcgm)
    out = run(root, ["/usr/bin/nv-hostengine", "--version"]).stdout
    assert out.startswith(f"Version : {dcgm}\n")
    assert "SIMULATED" in out
    port = free_port()
    with engine(root, port):
        for flag in ("-v", "--version"):
            out = dcgmi(root, port, flag).stdout
            assert out.startswith(f"\nLocal build info:\nVersion : {dcgm}\n")
            assert f"\nHostengine build info:\nVersion : {dcgm}\n" in out
            assert "SIMULATED" in out


def test_dcgmi_version_without_a_host_engine_prints_nothing(tmp_path: Path, debs) -> None:
    res = run(host(tmp_path, debs), ["/usr/bin/dcgmi", "-v"])
    assert (res.returncode, res.stdout) == (235, "")  # VersionInfo is silent (Version.cpp)


def test_the_host_engine_refuses_to_start_on_a_driver_mismatch(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    run(root, ["/usr/libexec/gpusim/nvidia-module-load"])
    unpack(pick(debs, "libnvidia-ml1_580.126.20"), root)
    res = run(
        root, ["/usr/bin/nv-hostengine", "-n", "-p", str(free_port()), "--pid", "/run/he.pid"]
    )
    assert res.returncode == 1
    assert "Driver/library version mismatch" in res.stdout


def test_the_host_engine_listens_on_loopback_only_by_default(h100) -> None:
    root, port = h100
    listening = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
            listening.add(addr)
    assert listening == {"0100007F"}  # 127.0.0.1
    assert (root / "run/nvhostengine.pid").exists()
