"""GPU faults written into a simulated host's state file from outside, and heal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.lab.gpusim import (
    FAULT_KINDS,
    apply_fault,
    hardware_for,
    heal,
    nspawn_args,
    prepare_root,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    prepare_root(tmp_path, hardware_for("H100", 8, "gpu01", True))
    return tmp_path


def state(root: Path) -> dict:
    return json.loads((root / "var/lib/gpusim/state.json").read_text())


def test_prepare_root_writes_the_hardware_and_a_healthy_state(root: Path) -> None:
    hw = json.loads((root / "etc/gpusim/hardware.json").read_text())
    assert hw == hardware_for("H100", 8, "gpu01", True)
    assert state(root)["gpus"] == {}
    assert state(root)["jobs"] == []


def test_prepare_root_keeps_existing_faults(root: Path) -> None:
    apply_fault(root, "gpu-temp", {"gpu": 2, "value": 90})
    prepare_root(root, hardware_for("H100", 8, "gpu01", True))
    assert state(root)["gpus"]["2"]["gpu_temp"] == 90


def test_fault_kinds_cover_the_lab_issue() -> None:
    assert set(FAULT_KINDS) >= {"gpu-temp", "memory-temp", "xid", "ecc-dbe", "gpu-missing",
                                "upgrade-validation", "gpu-jobs"}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "params", "check"),
    [
        ("gpu-temp", {"gpu": 3, "value": 93}, lambda s: s["gpus"]["3"]["gpu_temp"] == 93),
        ("memory-temp", {"gpu": 1, "value": 99}, lambda s: s["gpus"]["1"]["memory_temp"] == 99),
        ("gpu-temp", {"gpu": "3", "value": "88"}, lambda s: s["gpus"]["3"]["gpu_temp"] == 88),
        ("xid", {"gpu": 0, "xid": 48}, lambda s: [(e["gpu"], e["xid"]) for e in s["xid_events"]] == [(0, 48)]),
        ("ecc-dbe", {"gpu": 5, "count": 2}, lambda s: s["gpus"]["5"]["ecc_dbe"] == 2),
        ("ecc-dbe", {"gpu": 5, "row_remap_failure": "true"}, lambda s: s["gpus"]["5"]["row_remap_failure"]),
        ("gpu-missing", {"gpu": 7}, lambda s: s["gpus"]["7"]["missing"] is True),
        ("upgrade-validation", {}, lambda s: s["validation_failure"]["test"] == "software"),
        ("upgrade-validation", {"gpu": 2, "test": "pcie"},
         lambda s: s["validation_failure"] == {"gpu": 2, "test": "pcie", "message": None}),
        ("gpu-jobs", {"gpu": 4, "pid": 777, "used_memory_mib": 2048},
         lambda s: s["jobs"] == [{"gpu": 4, "pid": 777, "process_name": "python3", "used_memory_mib": 2048}]),
    ],
)  # fmt: skip
def test_a_fault_is_recorded_in_the_state_file(root: Path, kind: str, params: dict, check) -> None:
    apply_fault(root, kind, params)
    assert check(state(root))


def test_defaults_fill_in_omitted_parameters(root: Path) -> None:
    apply_fault(root, "gpu-temp", {})
    assert state(root)["gpus"]["0"]["gpu_temp"] == 95


def test_faults_accumulate(root: Path) -> None:
    apply_fault(root, "xid", {"gpu": 1, "xid": 79})
    apply_fault(root, "xid", {"gpu": 1, "xid": 79})
    apply_fault(root, "gpu-jobs", {"gpu": 0})
    apply_fault(root, "gpu-jobs", {"gpu": 1})
    st = state(root)
    assert len(st["xid_events"]) == 2
    assert len({j["pid"] for j in st["jobs"]}) == 2


def test_heal_returns_to_the_healthy_baseline(root: Path) -> None:
    apply_fault(root, "gpu-missing", {"gpu": 1})
    apply_fault(root, "xid", {"gpu": 1})
    apply_fault(root, "upgrade-validation", {})
    heal(root)
    st = state(root)
    assert st["gpus"] == {} and st["xid_events"] == [] and st["jobs"] == []
    assert "validation_failure" not in st


def test_writes_leave_no_temporary_files(root: Path) -> None:
    apply_fault(root, "gpu-temp", {"gpu": 1})
    heal(root)
    names = {p.name for p in (root / "var/lib/gpusim").iterdir()}
    assert names <= {"state.json", ".state.lock"}


@pytest.mark.parametrize(
    ("kind", "params", "key"),
    [
        ("gpu-melt", {}, "gpu-melt"),
        ("gpu-temp", {"gpu": 8}, "gpu"),
        ("gpu-temp", {"gpu": "zero"}, "gpu"),
        ("gpu-temp", {"temperature": 90}, "temperature"),
        ("ecc-dbe", {"row_remap_failure": "maybe"}, "row_remap_failure"),
        ("upgrade-validation", {"test": "smoke"}, "test"),
    ],
)
def test_bad_faults_are_refused_and_nothing_is_written(
    root: Path, kind: str, params: dict, key: str
) -> None:
    before = state(root)
    with pytest.raises(InputError) as err:
        apply_fault(root, kind, params)
    assert err.value.key == key
    assert state(root) == before


def test_a_root_without_simulated_gpus_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        apply_fault(tmp_path, "gpu-temp", {})


def test_an_nspawn_host_needs_no_extra_arguments(tmp_path: Path) -> None:
    assert nspawn_args(tmp_path) == []


def test_a_memory_temperature_cannot_be_injected_on_a_board_without_the_sensor(tmp_path):
    prepare_root(tmp_path, hardware_for("L40S", 2, "gpu06", False))
    with pytest.raises(InputError, match="no memory temperature sensor") as err:
        apply_fault(tmp_path, "memory-temp", {"gpu": 1})
    assert err.value.key == "gpu"


def test_a_job_goes_to_a_gpu_instance_of_a_mig_gpu(tmp_path):
    prepare_root(tmp_path, hardware_for("H100", 2, "gpu05", False, {0: ["3g.40gb", "2g.20gb"]}))
    apply_fault(tmp_path, "gpu-jobs", {"gpu": 0, "gpu_instance": 3, "pid": 7})
    assert state(tmp_path)["jobs"][0]["gpu_instance"] == 3


@pytest.mark.parametrize(("gpu", "gi"), [(0, 9), (1, 2)])  # no such instance / MIG off on GPU 1
def test_a_job_on_a_gpu_instance_that_does_not_exist_is_refused(tmp_path, gpu, gi):
    prepare_root(tmp_path, hardware_for("H100", 2, "gpu05", False, {0: ["3g.40gb", "2g.20gb"]}))
    with pytest.raises(InputError) as err:
        apply_fault(tmp_path, "gpu-jobs", {"gpu": gpu, "gpu_instance": gi})
    assert err.value.key == "gpu_instance"


def test_a_gpu_that_falls_off_the_bus_reports_xid_79(tmp_path):
    prepare_root(tmp_path, hardware_for("H100", 2, "gpu05", False))
    apply_fault(tmp_path, "gpu-missing", {"gpu": 1})
    assert [(e["gpu"], e["xid"]) for e in state(tmp_path)["xid_events"]] == [(1, 79)]
