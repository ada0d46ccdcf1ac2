"""Specification of building a host plan from inventory variables: bad input names its key."""

from __future__ import annotations

import pytest

from deployer.errors import InputError
from deployer.gpu.version_plan import (
    PLAN_VARS,
    DriverTarget,
    newer_in_branch,
    passed,
    plan_from_vars,
    plans_from_vars,
    resolve_target,
)
from deployer.yamlsrc import load_yaml_text

BASE = {"gpu_model": "H100", "gpu_count": 8}


def build(**overrides):
    return plan_from_vars("gpu01", {**BASE, **overrides})


BAD_INPUT = [
    ("unknown GPU model", dict(gpu_model="H900"), "gpu_model", "unknown GPU model"),
    ("GPU model of the wrong type", dict(gpu_model=["H100"]), "gpu_model", "expected a string"),
    ("no GPU model and no facts", dict(gpu_model=None), "gpu_model", "not set"),
    ("GPU count not a number", dict(gpu_count="eight"), "gpu_count", "positive integer"),
    ("GPU count zero", dict(gpu_count=0), "gpu_count", "positive integer"),
    ("GPU count a boolean", dict(gpu_count=True), "gpu_count", "positive integer"),
    ("GPU count missing", dict(gpu_count=None), "gpu_count", "declare gpu_count"),
    ("nvswitch not a boolean", dict(nvswitch="maybe"), "nvswitch", "true or false"),
    (
        "driver version malformed",
        dict(nvidia_driver_version="580.x"),
        "nvidia_driver_version",
        "not a driver version",
    ),
    (
        "driver version a bare branch",
        dict(nvidia_driver_version="580"),
        "nvidia_driver_version",
        "not a driver version",
    ),
    (
        "driver version loaded as a float",
        dict(nvidia_driver_version=570.26),
        "nvidia_driver_version",
        "quote the version",
    ),
    (
        "driver version of an unknown branch",
        dict(nvidia_driver_version="999.1.2"),
        "nvidia_driver_version",
        "unknown branch R999",
    ),
    ("branch malformed", dict(nvidia_driver_branch="58"), "nvidia_driver_branch", "not a branch"),
    (
        "branch unknown",
        dict(nvidia_driver_branch="R999"),
        "nvidia_driver_branch",
        "unknown branch R999",
    ),
    (
        "version and branch disagree",
        dict(nvidia_driver_version="580.65.06", nvidia_driver_branch="595"),
        "nvidia_driver_version",
        "not of nvidia_driver_branch",
    ),
    (
        "unknown module flavour",
        dict(nvidia_module_flavour="closed"),
        "nvidia_module_flavour",
        "not one of",
    ),
    ("DCGM version without patch", dict(dcgm_version="4.4"), "dcgm_version", "not a DCGM version"),
    ("DCGM version as a float", dict(dcgm_version=4.4), "dcgm_version", "quote the version"),
    ("DCGM version with a v", dict(dcgm_version="v4.4.2"), "dcgm_version", "not a DCGM version"),
    (
        "exporter version without the DCGM part",
        dict(dcgm_exporter_version="4.7.1"),
        "dcgm_exporter_version",
        "not an exporter tag",
    ),
    (
        "exporter tag truncated",
        dict(dcgm_exporter_version="4.4.2-4.7"),
        "dcgm_exporter_version",
        "not an exporter tag",
    ),
]


@pytest.mark.parametrize(
    ("case", "overrides", "key", "says"), BAD_INPUT, ids=[c for c, *_ in BAD_INPUT]
)
def test_bad_variable_raises_input_error_naming_the_key(case, overrides, key, says):
    with pytest.raises(InputError) as err:
        build(**overrides)
    assert err.value.key == key
    assert says in err.value.message
    assert "gpu01" in err.value.message


def test_error_from_a_loaded_yaml_mapping_names_file_and_line():
    variables = load_yaml_text(
        "gpu_model: H100\ngpu_count: 8\nnvidia_driver_branch: '999'\n", "host_vars/gpu01.yml"
    )
    with pytest.raises(InputError) as err:
        plan_from_vars("gpu01", variables)
    assert (err.value.source, err.value.line, err.value.key) == (
        "host_vars/gpu01.yml",
        3,
        "nvidia_driver_branch",
    )
    assert str(err.value).startswith("host_vars/gpu01.yml:3: nvidia_driver_branch: ")


def test_error_uses_the_origin_callback_when_given():
    with pytest.raises(InputError) as err:
        plan_from_vars(
            "gpu01", {**BASE, "dcgm_version": "4"}, origin=lambda key: ("group_vars/gpu.yml", 7)
        )
    assert (err.value.source, err.value.line) == ("group_vars/gpu.yml", 7)


ACCEPTED_SPELLINGS = [
    ("branch with an R", dict(nvidia_driver_branch="R580"), "driver_branch", "580"),
    ("branch as an integer", dict(nvidia_driver_branch=580), "driver_branch", "580"),
    (
        "branch derived from the version",
        dict(nvidia_driver_version="580.65.06"),
        "driver_branch",
        "580",
    ),
    ("model alias, any case", dict(gpu_model="a10g"), "gpu_model", "A10"),
    ("model in lower case", dict(gpu_model="h100"), "gpu_model", "H100"),
    ("nvswitch as Ansible yes", dict(nvswitch="yes"), "nvswitch", True),
    ("nvswitch as INI False", dict(nvswitch="False"), "nvswitch", False),
    ("gpu count as an INI string", dict(gpu_count="4"), "gpu_count", 4),
    ("flavour defaults to auto", dict(), "module_flavour", "auto"),
    ("empty DCGM version means unset", dict(dcgm_version=""), "dcgm_version", None),
    ("rack as a number", dict(rack=12), "rack", "12"),
]


@pytest.mark.parametrize(
    ("case", "overrides", "attr", "expected"),
    ACCEPTED_SPELLINGS,
    ids=[c for c, *_ in ACCEPTED_SPELLINGS],
)
def test_accepted_spelling_is_normalised(case, overrides, attr, expected):
    assert getattr(build(**overrides), attr) == expected


def test_gpu_count_comes_from_facts_when_the_inventory_has_none():
    p = plan_from_vars("gpu01", {"gpu_model": "H100"}, gpu_names=["NVIDIA H100 80GB HBM3"] * 8)
    assert p.gpu_count == 8


def test_retarget_replaces_only_the_driver():
    p = build(nvidia_driver_version="535.54.03", dcgm_version="4.4.2")
    moved = p.retarget(resolve_target("580"))
    assert (moved.driver_version, moved.driver_branch) == ("580.126.20", "580")
    assert moved.dcgm_version == "4.4.2" and moved.gpu_model == "H100"


# --- upgrade-driver --to -------------------------------------------------------------------

TARGETS = [
    ("580", DriverTarget("580", "580", "580.126.20", True)),
    ("R595", DriverTarget("R595", "595", "595.45.04", True)),
    ("580.65.06", DriverTarget("580.65.06", "580", "580.65.06", True)),
    ("580.82.07", DriverTarget("580.82.07", "580", "580.82.07", False)),
    ("570.26", DriverTarget("570.26", "570", "570.26", True)),
]


@pytest.mark.parametrize(("to", "target"), TARGETS, ids=[t for t, _ in TARGETS])
def test_upgrade_target_resolves(to, target):
    assert resolve_target(to) == target


@pytest.mark.parametrize(
    ("running", "newer"),
    [
        ("580.159.04", True),  # a newer R580 release than the matrix's newest (captured)
        ("580.126.20", False),  # the version itself
        ("580.65.06", False),  # older: 65 < 126 as numbers, not as text
        ("590.48.01", False),  # another branch
        (None, False),
        ("580.159.04~rc1", False),  # not a release's shape: nothing judged
    ],
)
def test_a_newer_release_of_the_same_branch_is_told_by_number(running, newer):
    assert newer_in_branch(running, "580.126.20") is newer


@pytest.mark.parametrize(
    ("installed", "loaded", "said"),
    [
        ("580.159.04", "580.159.04", "580.159.04"),  # installing 580.126.20 would downgrade
        ("580.159.04", "580.65.06", "580.159.04"),  # newer packages waiting for a reboot
        (None, "580.159.04", "580.159.04"),
        ("580.159.04", "580.126.20", None),  # newer packages under the planned module: a repair
        ("580.65.06", "580.65.06", None),  # an upgrade
        (None, None, None),  # a first install
    ],
)
def test_a_host_past_the_version_in_its_branch_would_be_downgraded(installed, loaded, said):
    assert passed("580.126.20", installed, loaded) == said


@pytest.mark.parametrize(
    ("to", "by_branch"), [("580", True), ("R580", True), ("580.126.20", False)]
)
def test_a_target_named_by_branch_is_its_newest_known_release(to, by_branch):
    assert resolve_target(to).by_branch is by_branch


BAD_TARGETS = [
    ("999", "unknown branch R999"),
    ("620", "no version of R620 is known"),
    ("999.1.2", "unknown branch R999"),
    ("latest", "neither a branch"),
    ("580.126.20.1", "neither a branch"),
    ("", "neither a branch"),
]


@pytest.mark.parametrize(("to", "says"), BAD_TARGETS, ids=[t or "empty" for t, _ in BAD_TARGETS])
def test_bad_upgrade_target_raises_input_error_on_to(to, says):
    with pytest.raises(InputError) as err:
        resolve_target(to)
    assert err.value.key == "--to"
    assert says in err.value.message


# --- many hosts: equal plan variables share one validation ----------------------------------


class RecordingVars(dict):
    """Variables that note every name looked up."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def test_a_plan_depends_only_on_the_plan_variables():
    variables = RecordingVars(BASE, nvidia_driver_branch="580", rack="r1", cluster="c1")
    plan_from_vars("gpu01", variables)
    assert variables.read <= set(PLAN_VARS)


def test_hosts_with_equal_plan_variables_each_get_their_own_name_and_rack():
    hosts = [
        ("gpu01", {**BASE, "rack": "r1", "nvidia_driver_branch": "580"}, None),
        ("gpu02", {**BASE, "rack": 7, "nvidia_driver_branch": "580"}, None),
        ("gpu03", {**BASE, "nvidia_driver_branch": "580"}, None),
    ]
    assert plans_from_vars(hosts) == [plan_from_vars(h, v) for h, v, _ in hosts]


def test_hosts_with_different_gpu_names_from_facts_are_planned_apart():
    hosts = [
        ("gpu01", {"gpu_count": 8}, ["NVIDIA H100 80GB HBM3"]),
        ("gpu02", {"gpu_count": 8}, ["NVIDIA H200"]),
    ]
    assert [p.gpu_names for p in plans_from_vars(hosts)] == [
        ("NVIDIA H100 80GB HBM3",),
        ("NVIDIA H200",),
    ]


def test_a_value_equal_to_an_accepted_one_but_of_another_type_is_still_refused():
    # True == 1 in Python: the second host must not inherit the first host's validation.
    with pytest.raises(InputError) as err:
        plans_from_vars(
            [
                ("gpu01", {**BASE, "gpu_count": 1}, None),
                ("gpu02", {**BASE, "gpu_count": True}, None),
            ]
        )
    assert err.value.key == "gpu_count"
    assert err.value.message.startswith("host gpu02:")


def test_an_explicit_null_is_not_taken_for_an_absent_variable():
    with pytest.raises(InputError) as err:
        plans_from_vars([("gpu01", dict(BASE), None), ("gpu02", {**BASE, "nvswitch": None}, None)])
    assert err.value.key == "nvswitch"
    assert err.value.message.startswith("host gpu02:")


def test_an_unhashable_bad_value_is_refused_naming_its_host():
    with pytest.raises(InputError) as err:
        plans_from_vars(
            [("gpu01", dict(BASE), None), ("gpu02", {**BASE, "gpu_model": ["H100"]}, None)]
        )
    assert err.value.key == "gpu_model"
    assert err.value.message.startswith("host gpu02:")
