"""Specification of the preflight rules: which plans the matrix accepts and which it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployer.gpu import matrix
from deployer.gpu.rules import check
from deployer.gpu.version_plan import plan_from_vars


def plan(host: str = "gpu01", gpu_names=None, **variables):
    variables.setdefault("gpu_count", 8)
    return plan_from_vars(host, variables, gpu_names=gpu_names)


def rules(refusals) -> list[str]:
    return [r.rule for r in refusals]


ACCEPTED = [
    ("H100 on R580, auto flavour", dict(gpu_model="H100", nvidia_driver_branch="580")),
    ("H100 on R535", dict(gpu_model="H100", nvidia_driver_version="535.54.03")),
    (
        "H100 with NVSwitch on R595",
        dict(gpu_model="H100", nvswitch=True, nvidia_driver_branch="595"),
    ),
    (
        "H200 on R580 open",
        dict(gpu_model="H200", nvidia_driver_branch="580", nvidia_module_flavour="open"),
    ),
    ("V100 on its last branch R580", dict(gpu_model="V100", nvidia_driver_branch="580")),
    (
        "V100 on R535 proprietary",
        dict(gpu_model="V100", nvidia_driver_branch="535", nvidia_module_flavour="proprietary"),
    ),
    (
        "A100 on R535 with DCGM 3",
        dict(
            gpu_model="A100",
            nvidia_driver_branch="535",
            dcgm_version="3.3.9",
            dcgm_exporter_version="3.3.9-3.6.1",
        ),
    ),
    ("A100 on R450 (CUDA 11)", dict(gpu_model="A100", nvidia_driver_version="450.80.02")),
    ("GH200 on R580", dict(gpu_model="GH200", nvidia_driver_branch="580")),
    ("B200 at its minimum 570.133.20", dict(gpu_model="B200", nvidia_driver_version="570.133.20")),
    (
        "RTX PRO 6000 at its minimum",
        dict(gpu_model="RTX-PRO-6000", nvidia_driver_version="575.57.08"),
    ),
    ("T4 on an unlisted R470 version", dict(gpu_model="T4", nvidia_driver_version="470.256.02")),
    (
        "DCGM 4.4.0, first with -cuda13, on R580",
        dict(
            gpu_model="H100",
            nvidia_driver_branch="580",
            dcgm_version="4.4.0",
            dcgm_exporter_version="4.4.0-4.5.0",
        ),
    ),
    (
        "exporter built on a newer DCGM than the host's",
        dict(
            gpu_model="H100",
            nvidia_driver_branch="580",
            dcgm_version="4.4.1",
            dcgm_exporter_version="4.5.3-4.8.2",
        ),
    ),
    ("no versions at all: defaults", dict(gpu_model="L40S")),
]


@pytest.mark.parametrize(("case", "variables"), ACCEPTED, ids=[c for c, _ in ACCEPTED])
def test_compatible_plan_is_accepted(case, variables):
    assert check([plan(**variables)]) == []


REFUSED = [
    ("V100 after R580", dict(gpu_model="V100", nvidia_driver_branch="595"), "arch-last-branch"),
    (
        "V100 on an unlisted R620 version",
        dict(gpu_model="V100", nvidia_driver_version="620.10.1"),
        "arch-last-branch",
    ),
    (
        "P100 after R580",
        dict(gpu_model="P100", nvidia_driver_version="590.44.01"),
        "arch-last-branch",
    ),
    (
        "B200 below its SKU minimum",
        dict(gpu_model="B200", nvidia_driver_version="570.26"),
        "driver-minimum",
    ),
    (
        "RTX PRO 6000 below its minimum",
        dict(gpu_model="RTX-PRO-6000", nvidia_driver_version="575.51.03"),
        "driver-minimum",
    ),
    (
        "H100 below the Hopper floor",
        dict(gpu_model="H100", nvidia_driver_version="450.80.02"),
        "driver-minimum",
    ),
    (
        "open modules on Volta",
        dict(gpu_model="V100", nvidia_driver_branch="580", nvidia_module_flavour="open"),
        "module-open-unsupported",
    ),
    (
        "proprietary modules on GH200",
        dict(gpu_model="GH200", nvidia_driver_branch="580", nvidia_module_flavour="proprietary"),
        "module-open-required",
    ),
    (
        "proprietary modules on Blackwell",
        dict(gpu_model="B200", nvidia_driver_branch="580", nvidia_module_flavour="proprietary"),
        "module-open-required",
    ),
    (
        "open modules before R515",
        dict(gpu_model="T4", nvidia_driver_version="470.256.02", nvidia_module_flavour="open"),
        "module-open-branch",
    ),
    (
        "branch with no known version",
        dict(gpu_model="H100", nvidia_driver_branch="620"),
        "driver-version-unknown",
    ),
    (
        "CUDA 13 driver with DCGM before -cuda13",
        dict(gpu_model="H100", nvidia_driver_branch="580", dcgm_version="4.3.1"),
        "dcgm-cuda-minimum",
    ),
    (
        "CUDA 13 driver with DCGM 3",
        dict(gpu_model="H100", nvidia_driver_branch="580", dcgm_version="3.3.9"),
        "dcgm-cuda-minimum",
    ),
    (
        "CUDA 12 driver with DCGM 3.0",
        dict(
            gpu_model="H100",
            nvidia_driver_branch="535",
            dcgm_version="3.0.4",
            dcgm_exporter_version="3.3.5-3.4.0",
        ),
        "dcgm-cuda-minimum",
    ),
    (
        "DCGM 2",
        dict(
            gpu_model="A100",
            nvidia_driver_branch="535",
            dcgm_version="2.4.5",
            dcgm_exporter_version="4.4.2-4.7.1",
        ),
        "dcgm-major-unsupported",
    ),
    (
        "exporter 3.x on DCGM 4",
        dict(
            gpu_model="H100",
            nvidia_driver_branch="535",
            dcgm_version="4.4.2",
            dcgm_exporter_version="3.3.9-3.6.1",
        ),
        "exporter-dcgm-major",
    ),
    (
        "exporter 4.x on DCGM 3",
        dict(
            gpu_model="H100",
            nvidia_driver_branch="535",
            dcgm_version="3.3.9",
            dcgm_exporter_version="4.4.2-4.7.1",
        ),
        "exporter-dcgm-major",
    ),
    (
        "exporter built on an older DCGM",
        dict(
            gpu_model="H100",
            nvidia_driver_branch="580",
            dcgm_version="4.5.3",
            dcgm_exporter_version="4.4.2-4.7.1",
        ),
        "exporter-dcgm-older",
    ),
    (
        "DCGM newer than every known exporter",
        dict(gpu_model="H100", nvidia_driver_branch="580", dcgm_version="4.9.0"),
        "exporter-none-known",
    ),
]


@pytest.mark.parametrize(("case", "variables", "rule"), REFUSED, ids=[c for c, _, _ in REFUSED])
def test_incompatible_plan_is_refused_by_its_rule(case, variables, rule):
    refusals = check([plan(**variables)])
    assert rules(refusals) == [rule]
    assert refusals[0].host == "gpu01"
    assert refusals[0].message and refusals[0].fix


def test_volta_past_r580_refusal_names_host_rule_and_fix():
    (refusal,) = check([plan("gpu04", gpu_model="V100", nvidia_driver_branch="595")])
    assert str(refusal) == (
        "gpu04: V100 (Volta) is not supported after branch R580; "
        "plan R580 (580.126.20) or keep this host on its current branch [arch-last-branch]"
    )


def test_cuda13_refusal_names_the_cuda13_package_and_a_dcgm_to_plan():
    (refusal,) = check([plan(gpu_model="H100", nvidia_driver_branch="580", dcgm_version="4.3.1")])
    assert "datacenter-gpu-manager-4-cuda13" in refusal.message
    assert "CUDA 13" in refusal.message
    assert "dcgm_version" in refusal.fix and "4.4.0" in refusal.fix


def test_refusal_resting_on_an_unverified_fact_says_so():
    (refusal,) = check(
        [plan(gpu_model="B200", nvidia_driver_branch="580", nvidia_module_flavour="proprietary")]
    )
    assert refusal.verified is False
    assert "unverified" in str(refusal)


def test_refusal_resting_on_a_verified_fact_cites_its_source():
    (refusal,) = check(
        [plan(gpu_model="GH200", nvidia_driver_branch="580", nvidia_module_flavour="proprietary")]
    )
    assert refusal.verified is True
    assert "[S8]" in refusal.source


def test_every_host_is_checked_and_named():
    plans = [
        plan("gpu01", gpu_model="H100", nvidia_driver_branch="580"),
        plan("gpu04", gpu_model="V100", nvidia_driver_branch="595"),
        plan("gpu05", gpu_model="V100", nvidia_driver_branch="595"),
    ]
    assert [r.host for r in check(plans)] == ["gpu04", "gpu05"]


def test_hosts_of_one_plan_are_each_refused_under_their_own_name_with_the_same_message():
    plans = [plan(h, gpu_model="V100", nvidia_driver_branch="595") for h in ("gpu04", "gpu05")]
    refusals = check(plans)
    assert [r.host for r in refusals] == ["gpu04", "gpu05"]
    assert [str(r) for r in refusals] == [str(r) for p in plans for r in check([p])]
    assert str(refusals[1]).startswith("gpu05: V100 (Volta) is not supported after branch R580")


def test_one_host_can_break_several_rules_at_once():
    refusals = check(
        [
            plan(
                gpu_model="V100",
                nvidia_driver_branch="595",
                nvidia_module_flavour="open",
                dcgm_version="4.3.1",
            )
        ]
    )
    assert set(rules(refusals)) == {
        "arch-last-branch",
        "module-open-unsupported",
        "dcgm-cuda-minimum",
    }


# --- GPU models from facts -----------------------------------------------------------------


def test_facts_model_agreeing_with_inventory_is_accepted():
    p = plan(gpu_model="V100", nvidia_driver_branch="580", gpu_names=["Tesla V100-SXM2-32GB"] * 8)
    assert check([p]) == []


def test_facts_model_decides_when_the_inventory_has_none():
    p = plan_from_vars(
        "gpu04", {"nvidia_driver_branch": "595"}, gpu_names=["Tesla V100-SXM2-32GB"] * 8
    )
    assert rules(check([p])) == ["arch-last-branch"]


def test_facts_model_disagreeing_with_inventory_is_refused():
    p = plan(gpu_model="H100", gpu_names=["NVIDIA H200"] * 8)
    (refusal,) = check([p])
    assert refusal.rule == "gpu-model-facts"
    assert "H200" in refusal.fix


def test_unknown_gpu_name_in_facts_is_refused():
    p = plan(gpu_model="H100", gpu_names=["NVIDIA Frobnicator 9000"])
    assert rules(check([p])) == ["gpu-name-unknown"]


def test_mixed_gpu_models_in_facts_are_refused():
    p = plan(gpu_model="H100", gpu_names=["NVIDIA H100 80GB HBM3", "NVIDIA L40S"])
    assert rules(check([p])) == ["gpu-models-mixed"]


# --- cross-host rules ----------------------------------------------------------------------


def test_gb200_rack_with_one_driver_is_accepted():
    plans = [
        plan(h, gpu_model="GB200", rack="r1", nvidia_driver_version="580.126.20")
        for h in ("gb01", "gb02")
    ]
    assert check(plans) == []


def test_gb200_rack_with_two_drivers_is_refused_on_every_host_of_the_rack():
    plans = [
        plan("gb01", gpu_model="GB200", rack="r1", nvidia_driver_version="580.126.20"),
        plan("gb02", gpu_model="GB200", rack="r1", nvidia_driver_version="580.65.06"),
        plan("gb03", gpu_model="GB200", rack="r2", nvidia_driver_version="580.65.06"),
    ]
    refusals = check(plans)
    assert [(r.host, r.rule) for r in refusals] == [
        ("gb01", "rack-uniform-driver"),
        ("gb02", "rack-uniform-driver"),
    ]


def test_other_models_may_mix_drivers_in_a_rack():
    plans = [
        plan("gpu01", gpu_model="H100", rack="r1", nvidia_driver_version="580.126.20"),
        plan("gpu02", gpu_model="H100", rack="r1", nvidia_driver_version="580.65.06"),
    ]
    assert check(plans) == []


# --- rules that only an edited matrix can trigger ------------------------------------------


@pytest.fixture
def edited_matrix(monkeypatch, tmp_path: Path):
    """Swap in a copy of the data file changed by ``edit(data)``."""

    def use(edit) -> None:
        data = yaml.safe_load(matrix.DATA_FILE.read_text(encoding="utf-8"))
        edit(data)
        path = tmp_path / "compat.yml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        loaded = matrix.load_matrix(path)
        monkeypatch.setattr(matrix, "matrix", lambda: loaded)

    return use


def test_no_default_driver_when_no_ltsb_or_pb_version_supports_the_gpu(edited_matrix):
    def drop_versions(data):
        for branch in data["driver_branches"].values():
            if branch["type"] in ("LTSB", "PB"):
                branch["versions"] = {}

    edited_matrix(drop_versions)
    assert rules(check([plan(gpu_model="H100")])) == ["driver-no-default"]


def test_no_default_dcgm_when_no_exporter_pair_supports_the_cuda_major(edited_matrix):
    def raise_cuda13_floor(data):
        data["dcgm"]["min_for_cuda"]["13"]["dcgm"] = "9.0.0"

    edited_matrix(raise_cuda13_floor)
    assert rules(check([plan(gpu_model="H100", nvidia_driver_branch="580")])) == ["dcgm-no-default"]
