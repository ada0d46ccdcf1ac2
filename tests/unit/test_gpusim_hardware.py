"""The simulated GPU description of a host: real product names, deterministic identities."""

from __future__ import annotations

import re

import pytest

from deployer.errors import InputError
from deployer.lab.gpusim import hardware_for


@pytest.mark.parametrize(
    ("model", "name", "memory_mib", "architecture", "mig"),
    [
        ("H100", "NVIDIA H100 80GB HBM3", 81559, "Hopper", True),
        ("H200", "NVIDIA H200", 143771, "Hopper", True),
        ("A100", "NVIDIA A100-SXM4-80GB", 81920, "Ampere", True),
        ("V100", "Tesla V100-SXM2-32GB", 32768, "Volta", False),
        ("B200", "NVIDIA B200", 183359, "Blackwell", True),
        ("T4", "Tesla T4", 15109, "Turing", False),  # R535's table (SOURCES.md)
        ("L40S", "NVIDIA L40S", 46068, "Ada Lovelace", False),
        ("A10", "NVIDIA A10G", 23028, "Ampere", False),
        ("A800", "NVIDIA A800-SXM4-80GB", 81920, "Ampere", True),
        ("H800", "NVIDIA H800", 81559, "Hopper", True),
        ("P100", "Tesla P100-PCIE-16GB", 16384, "Pascal", False),
    ],
)
def test_each_model_is_described_with_the_name_nvidia_smi_prints(
    model: str, name: str, memory_mib: int, architecture: str, mig: bool
) -> None:
    hw = hardware_for(model, 2, "gpu09", False)
    assert [g["name"] for g in hw["gpus"]] == [name, name]
    assert {g["memory_total_mib"] for g in hw["gpus"]} == {memory_mib}
    assert {g["architecture"] for g in hw["gpus"]} == {architecture}
    assert {g["mig_capable"] for g in hw["gpus"]} == {mig}


def test_the_same_inputs_give_the_same_description() -> None:
    assert hardware_for("H100", 8, "gpu01", True) == hardware_for("H100", 8, "gpu01", True)


def test_uuids_differ_between_hosts_and_between_gpus() -> None:
    a = [g["uuid"] for g in hardware_for("H100", 8, "gpu01", True)["gpus"]]
    b = [g["uuid"] for g in hardware_for("H100", 8, "gpu02", True)["gpus"]]
    assert len(set(a)) == 8
    assert not set(a) & set(b)


def test_uuids_have_the_nvidia_smi_form() -> None:
    for g in hardware_for("A100", 4, "gpu03", False)["gpus"]:
        assert re.fullmatch(
            r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", g["uuid"]
        )


def test_an_hgx_board_has_the_eight_hgx_bus_ids_in_index_order() -> None:
    buses = [g["pci_bus_id"] for g in hardware_for("H200", 8, "gpu02", True)["gpus"]]
    assert buses == [f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")]


def test_indices_run_from_zero_to_count_minus_one() -> None:
    assert [g["index"] for g in hardware_for("V100", 8, "gpu04", False)["gpus"]] == list(range(8))


def test_nvswitch_hosts_have_four_switches_and_others_none() -> None:
    assert len(hardware_for("H100", 8, "gpu01", True)["nvswitches"]) == 4
    assert hardware_for("A100", 4, "gpu03", False)["nvswitches"] == []


def test_the_description_says_it_is_simulated() -> None:
    assert hardware_for("H100", 1, "gpu01", False)["simulated"] is True


@pytest.mark.parametrize(
    ("model", "count", "key"),
    [
        ("H1000", 8, "gpu_model"),
        ("h100", 8, "gpu_model"),
        ("H100", 0, "gpu_count"),
        ("H100", 17, "gpu_count"),
        ("H100", "8", "gpu_count"),
        ("H100", True, "gpu_count"),
    ],
)
def test_bad_model_or_count_is_refused_naming_the_key(
    model: object, count: object, key: str
) -> None:
    with pytest.raises(InputError) as err:
        hardware_for(model, count, "gpu01", False)  # type: ignore[arg-type]
    assert err.value.key == key
