"""The exporter of every GPU host planned at once (``gpu_plan.exporter_plans``, which
``gpumon-deploy capacity`` reads for 100,000 hosts): exactly what each host's own ``template_plan``
gives, planned once per distinct combination of the variables it reads."""

from __future__ import annotations

import pytest

from deployer.errors import InputError
from deployer.gpu import gpu_plan
from deployer.unsafe import mark_unsafe
from tests.unit.test_compat_plan import RecordingVars

H100 = {"gpu_model": "H100", "gpu_count": 8, "nvidia_driver_branch": "580"}
EXTRA = [{"field": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "type": "counter", "help": "DBE"}]


def alone(host, variables):
    plan = gpu_plan.template_plan(host, variables)
    return gpu_plan.ExporterPlan(
        plan["exporter_csv"], plan["exporter_csv_mig"], int(plan["gpu_count"] or 0)
    )


FLEET = [
    ("g01", {**H100, "rack": "r1"}),
    ("g02", {**H100, "rack": "r2"}),
    ("g03", {**H100, "gpu_count": 4}),
    ("g04", {**H100, "gpu_count": "8"}),  # a string the plan reads as 8
    ("g05", {**H100, "dcgm_exporter_field_groups": ["upstream"]}),
    ("g06", {**H100, "dcgm_exporter_field_groups": ["upstream", "profiling"]}),
    ("g07", {**H100, "dcgm_exporter_field_groups": ["upstream", "profiling"]}),  # another list
    ("g08", {**H100, "dcgm_exporter_extra_fields": EXTRA}),
    ("g09", {**H100, "dcgm_exporter_mig_utilization": False}),
    ("g10", {**H100, "dcgm_exporter_mig_utilization": "no"}),
    ("g11", {**H100, "dcgm_exporter_version": "4.2.3-4.1.3"}),
    ("g12", {"gpu_model": "A100", "gpu_count": 4}),
    ("g13", {"gpu_model": "H100"}),  # no count: the stand-in's one GPU
    ("g14", {"gpu_count": 2}),  # no model: the stand-in's
    ("g15", {**H100, "nvidia_driver_branch": "450"}),  # refused by the matrix: a stand-in
    ("g16", {**H100, "dcgm_exporter_field_groups": [mark_unsafe("upstream")]}),
]


def test_each_host_gets_what_its_own_template_plan_gives():
    assert gpu_plan.exporter_plans(FLEET) == {h: alone(h, v) for h, v in FLEET}


def test_one_template_plan_per_distinct_combination_of_the_variables_it_reads(monkeypatch):
    planned: list[str] = []
    real = gpu_plan.template_plan

    def counting(host, variables, *args):
        planned.append(host)
        return real(host, variables, *args)

    monkeypatch.setattr(gpu_plan, "template_plan", counting)
    groups = ["upstream", "profiling"]
    fleet = [
        (
            f"g{i:03d}",
            {
                **H100,
                "rack": f"r{i % 4}",
                "ansible_host": f"10.0.0.{i}",
                "dcgm_exporter_field_groups": list(groups),
            },
        )
        for i in range(100)
    ]
    fleet.append(("h001", {**H100, "gpu_count": 4}))
    fleet.append(("h002", {**H100, "gpu_count": "4"}))  # the same count, another type
    plans = gpu_plan.exporter_plans(fleet)
    assert planned == ["g000", "h001", "h002"]
    assert len(plans) == 102 and plans["g099"] == alone("g099", fleet[99][1])


@pytest.mark.parametrize(
    "variables",
    [
        H100,
        {"gpu_model": "H100"},
        {**H100, "nvidia_driver_branch": "450"},
        {**H100, "dcgm_exporter_extra_fields": EXTRA, "dcgm_exporter_field_groups": ["upstream"]},
        {
            **H100,
            "dcgm_exporter_version": "4.5.3-4.8.2",
            "dcgm_exporter_hpc_job_mapping": "slurm",
            "dcgm_exporter_slurm_prolog_dir": "/etc/slurm/prolog.d",
            "dcgm_exporter_slurm_epilog_dir": "/etc/slurm/epilog.d",
        },
        {**H100, "nvidia_driver_reboot": "never", "nvidia_driver_reboot_force": True},
    ],
    ids=["pinned", "stand-in count", "refused", "fields", "job mapping", "role choices"],
)
def test_template_plan_reads_no_variable_the_batch_does_not_compare(variables):
    recording = RecordingVars(variables, cluster="c1", ansible_host="10.0.0.1")
    gpu_plan.template_plan("g01", recording)
    assert recording.read <= set(gpu_plan.TEMPLATE_PLAN_VARS)


def test_a_value_equal_to_an_accepted_one_but_of_another_type_is_still_refused():
    # 4.0 == 4 and True == 1 in Python: neither host may inherit the first host's plan.
    for bad in (4.0, True):
        with pytest.raises(InputError, match="host g02: expected a positive integer"):
            gpu_plan.exporter_plans(
                [
                    ("g01", {**H100, "gpu_count": 1 if bad is True else 4}),
                    ("g02", {**H100, "gpu_count": bad}),
                ]
            )


def test_the_first_host_with_a_bad_value_raises_as_it_would_alone():
    fleet = [
        ("g01", H100),
        ("g02", {**H100, "dcgm_exporter_field_groups": ["nosuch"]}),
        ("g03", {**H100, "dcgm_exporter_field_groups": ["nosuch"]}),
    ]
    with pytest.raises(InputError) as err:
        gpu_plan.exporter_plans(fleet)
    assert err.value.key == "dcgm_exporter_field_groups" and "nosuch" in str(err.value)
    bad_job_map = {**H100, "dcgm_exporter_hpc_job_mapping": "pbs"}
    with pytest.raises(InputError, match="host g02:"):
        gpu_plan.exporter_plans([("g01", H100), ("g02", bad_job_map), ("g03", bad_job_map)])
