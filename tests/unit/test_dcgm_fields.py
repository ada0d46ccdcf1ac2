"""The DCGM field-name registry against what real dcgm-exporter versions accept.

The real exporter looks every CSV name up in go-dcgm's current and legacy name maps and exits on an
unknown one (NVIDIA/dcgm-exporter internal/pkg/counters/counter_config.go:110-117 @ 691c927). The
go-dcgm maps of two exporter versions and NVIDIA's shipped CSVs are in
``../shared/gpu_reality_fixtures/dcgm-exporter/``: the registry must agree with them name by name,
and the CSV gpumon-deploy writes for a version must only hold names that version accepts.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest

from deployer import dcgm_fields
from deployer.dcgm_fields import EXPORTER_TAGS, FIELDS_BY_KEY
from deployer.errors import InputError
from deployer.gpu import matrix
from tests.reality import capture, capture_text

# The shipped CSVs in the fixtures, by the exporter tag whose go-dcgm names apply (HEAD d5e5f51
# builds with the go-dcgm of 4.5.3-4.8.2, ec245c0: its go.mod).
SHIPPED = {
    "4.4.2-4.7.1": "4.4.2-4.7.1",
    "4.5.3-4.8.2": "4.5.3-4.8.2",
    "HEAD": "4.5.3-4.8.2",
}
CSV_KINDS = ("default-counters", "dcp-metrics-included")


@cache
def go_dcgm_names() -> dict[str, set[str]]:
    """{exporter tag: names its go-dcgm accepts (current and legacy maps)} from the fixture."""
    data = json.loads(capture_text("dcgm-exporter/go-dcgm-field-names.json"))
    out = {}
    for commit, maps in data.items():
        tags = [t for t, c in dcgm_fields.EXPORTER_GO_DCGM.items() if c.startswith(commit)]
        assert tags, f"fixture go-dcgm {commit} is the go-dcgm of no known exporter tag"
        for tag in tags:
            out[tag] = set(maps["current"]) | set(maps["legacy"])
    return out


def fixture_ids() -> dict[str, dict[str, int]]:
    data = json.loads(capture_text("dcgm-exporter/go-dcgm-field-names.json"))
    return {c: {**maps["legacy"], **maps["current"]} for c, maps in data.items()}


def shipped_csv(version: str, kind: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(enabled, commented-out) (name, type) lines of one of NVIDIA's shipped CSVs."""
    enabled, commented = [], []
    for raw in capture_text(f"dcgm-exporter/{version}__{kind}.csv").splitlines():
        line = raw.strip()
        target = enabled
        if line.startswith("#"):
            line, target = line.lstrip("#").strip(), commented
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].startswith("DCGM_"):
            target.append((parts[0], parts[1]))
    return enabled, commented


def csv_names(csv: str) -> list[str]:
    return [
        line.split(",")[0].strip()
        for line in csv.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def every_registry_name() -> set[str]:
    return {n.name for f in FIELDS_BY_KEY.values() for n in f.all_names()}


ALL_GROUPS = tuple(dcgm_fields.GROUPS)


# ---------------------------------------------------------------- the registry against go-dcgm


def test_every_exporter_tag_gpumon_plans_has_its_field_names_here():
    assert set(matrix.matrix().exporter_tags) == set(EXPORTER_TAGS)


@pytest.mark.parametrize("tag", ["4.4.2-4.7.1", "4.5.3-4.8.2"])
def test_the_registry_accepts_exactly_the_names_that_versions_go_dcgm_knows(tag):
    known = go_dcgm_names()[tag]
    wrong = {
        name: dcgm_fields.accepts(name, tag)
        for name in every_registry_name()
        if not name.startswith("DCGM_EXP_") and dcgm_fields.accepts(name, tag) != (name in known)
    }
    assert wrong == {}


@pytest.mark.parametrize("tag", ["4.4.2-4.7.1", "4.5.3-4.8.2"])
def test_the_csv_of_every_group_holds_only_names_that_version_accepts(tag):
    csv = dcgm_fields.render_csv(ALL_GROUPS, exporter_tag=tag, mig_enabled=True)
    known = go_dcgm_names()[tag] | set(dcgm_fields.EXPORTER_METRICS)
    assert [n for n in csv_names(csv) if n not in known] == []


def test_field_ids_are_go_dcgms():
    ids = fixture_ids()
    for commit, names in ids.items():
        for f in FIELDS_BY_KEY.values():
            if f.field_id is not None and f.metric in names:
                assert names[f.metric] == f.field_id, (commit, f.metric)


def test_field_112_is_not_known_by_its_old_name_to_4_7_1_so_its_csv_uses_the_new_one():
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in go_dcgm_names()["4.4.2-4.7.1"]
    f = FIELDS_BY_KEY["clocks_event_reasons"]
    assert dcgm_fields.csv_name(f, "4.4.2-4.7.1") == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"


# ---------------------------------------------------------------- the shipped CSVs


@pytest.mark.parametrize("kind", CSV_KINDS)
@pytest.mark.parametrize("version", list(SHIPPED))
def test_every_name_nvidia_ships_in_a_csv_is_accepted_by_that_version(version, kind):
    enabled, commented = shipped_csv(version, kind)
    tag = SHIPPED[version]
    refused = [
        n
        for n, _t in enabled + commented
        if n in every_registry_name() | set(dcgm_fields.EXPORTER_METRICS)
        and not dcgm_fields.accepts(n, tag)
    ]
    assert enabled and refused == []


@pytest.mark.parametrize("kind", CSV_KINDS)
@pytest.mark.parametrize("version", list(SHIPPED))
def test_the_catalogues_types_are_the_shipped_ones(version, kind):
    enabled, commented = shipped_csv(version, kind)
    # a commented-out line of a name the file enables is an alternative NVIDIA left in (PCIe bytes
    # as a counter): the enabled line is the one that runs
    on = {n for n, _t in enabled}
    lines = enabled + [(n, t) for n, t in commented if n not in on]
    wrong = [
        (n, t, dcgm_fields.FIELDS[n].type)
        for n, t in lines
        if n in dcgm_fields.FIELDS and dcgm_fields.FIELDS[n].type != t
    ]
    assert wrong == []


@pytest.mark.parametrize("version", list(SHIPPED))
def test_the_upstream_group_is_nvidias_default_csv_without_its_profiling_fields(version):
    enabled, _ = shipped_csv(version, "default-counters")
    shipped = [n for n, _t in enabled if not n.startswith("DCGM_FI_PROF_")]
    ours = [FIELDS_BY_KEY[k].metric for k in dcgm_fields.GROUPS["upstream"]]
    assert ours == shipped


# ---------------------------------------------------------------- one place, one edit


def test_metric_names_by_key():
    assert dcgm_fields.metric("gpu_temp") == "DCGM_FI_DEV_GPU_TEMP"
    assert dcgm_fields.METRICS["memory_temp"] == "DCGM_FI_DEV_MEMORY_TEMP"
    assert dcgm_fields.metric("driver_version") == "DCGM_FI_DRIVER_VERSION"


def test_dcgm_4_6_names_are_known_and_accepted_from_exporter_4_8_3_only():
    f = FIELDS_BY_KEY["gpu_temp"]
    celsius = [n for n in f.all_names() if n.name == "DCGM_FI_DEV_GPU_TEMP_CELSIUS"]
    assert celsius and celsius[0].since == "4.6.0-4.8.3"
    assert not dcgm_fields.accepts("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "4.5.3-4.8.2")
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS" not in go_dcgm_names()["4.5.3-4.8.2"]
    # the old name stays a deprecated alias: every tag accepts it
    assert all(dcgm_fields.accepts("DCGM_FI_DEV_GPU_TEMP", t) for t in EXPORTER_TAGS)


def test_a_rename_is_one_edit_the_csv_and_the_scrape_follow(monkeypatch):
    renamed = dataclasses.replace(FIELDS_BY_KEY["gpu_temp"], metric="DCGM_FI_DEV_GPU_TEMP_CELSIUS")
    catalogue = tuple(renamed if f.key == "gpu_temp" else f for f in FIELDS_BY_KEY.values())
    monkeypatch.setattr(dcgm_fields, "_CATALOGUE", catalogue)
    monkeypatch.setitem(dcgm_fields.FIELDS_BY_KEY, "gpu_temp", renamed)
    # the newest exporter writes the new name; an older one the name it knows
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge," in dcgm_fields.render_csv(
        ["upstream"], exporter_tag="4.6.0-4.8.3"
    )
    assert "\nDCGM_FI_DEV_GPU_TEMP, gauge," in dcgm_fields.render_csv(
        ["upstream"], exporter_tag="4.5.3-4.8.2"
    )
    # and the dcgm job stores the older exporter's series under the new name
    assert {
        "source_labels": ["__name__"],
        "regex": "DCGM_FI_DEV_GPU_TEMP",
        "target_label": "__name__",
        "replacement": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    } in dcgm_fields.metric_relabel_configs()


def test_a_renamed_label_field_is_relabelled_as_a_label(monkeypatch):
    renamed = dataclasses.replace(
        FIELDS_BY_KEY["driver_version"], metric="DCGM_FI_SYSTEM_DRIVER_VERSION"
    )
    catalogue = tuple(renamed if f.key == "driver_version" else f for f in FIELDS_BY_KEY.values())
    monkeypatch.setattr(dcgm_fields, "_CATALOGUE", catalogue)
    configs = dcgm_fields.metric_relabel_configs()
    assert {
        "action": "labelmap",
        "regex": "DCGM_FI_DRIVER_VERSION",
        "replacement": "DCGM_FI_SYSTEM_DRIVER_VERSION",
    } in configs
    assert {"action": "labeldrop", "regex": "DCGM_FI_DRIVER_VERSION"} in configs


def test_exporter_3_gets_field_112_by_its_old_name_and_the_scrape_renames_it():
    csv = dcgm_fields.render_csv(["clock_events"], exporter_tag="3.3.9-3.6.1")
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge," in csv
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS," not in csv
    assert dcgm_fields.metric_relabel_configs() == [
        {
            "source_labels": ["__name__"],
            "regex": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            "target_label": "__name__",
            "replacement": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        }
    ]


def test_no_relabelling_is_needed_for_a_fleet_of_current_exporters():
    assert dcgm_fields.metric_relabel_configs(["4.5.3-4.8.2", "4.6.0-4.8.3"]) == []


# ---------------------------------------------------------------- the CSV a host gets


def test_a_mig_host_also_collects_the_instances_graphics_activity():
    with_mig = dcgm_fields.csv_from_vars({}, exporter_tag="4.5.3-4.8.2", mig_enabled=True)
    without = dcgm_fields.csv_from_vars({}, exporter_tag="4.5.3-4.8.2")
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge," in with_mig
    assert "DCGM_FI_PROF_" not in without


def test_the_mig_utilization_field_can_be_turned_off():
    csv = dcgm_fields.csv_from_vars(
        {"dcgm_exporter_mig_utilization": False}, exporter_tag="4.5.3-4.8.2", mig_enabled=True
    )
    assert "DCGM_FI_PROF_" not in csv


def test_an_exporter_tag_without_field_names_is_refused_naming_the_version_key():
    with pytest.raises(InputError) as err:
        dcgm_fields.csv_from_vars({}, exporter_tag="9.9.9-9.9.9")
    assert err.value.key == "dcgm_exporter_version"


def test_an_exporter_metric_the_version_does_not_have_is_refused():
    extra = [{"field": "DCGM_EXP_P2P_STATUS", "type": "counter", "help": "P2P"}]
    with pytest.raises(InputError) as err:
        dcgm_fields.csv_from_vars({"dcgm_exporter_extra_fields": extra}, exporter_tag="4.2.3-4.2.0")
    assert err.value.key == "dcgm_exporter_extra_fields[0]"
    ok = dcgm_fields.csv_from_vars(
        {"dcgm_exporter_extra_fields": extra}, exporter_tag="4.5.3-4.8.2"
    )
    assert "DCGM_EXP_P2P_STATUS, counter, P2P" in ok


def test_an_extra_field_named_as_a_newer_dcgm_calls_it_is_refused_for_an_older_exporter():
    extra = [{"field": "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "type": "gauge", "help": "t"}]
    with pytest.raises(InputError, match="would exit at start"):
        dcgm_fields.csv_from_vars({"dcgm_exporter_extra_fields": extra}, exporter_tag="4.5.3-4.8.2")


def test_the_planned_exporter_csv_follows_the_plans_exporter_version():
    from deployer.gpu import gpu_plan

    view = gpu_plan.template_plan(
        "g1",
        {
            "gpu_model": "H100",
            "gpu_count": 8,
            "nvswitch": True,
            "dcgm_exporter_version": "4.5.3-4.8.2",
        },
    )
    assert view["exporter_csv"] == dcgm_fields.render_csv(
        dcgm_fields.DEFAULT_GROUPS, exporter_tag="4.5.3-4.8.2"
    )


def test_the_fixture_is_where_the_tests_expect_it():
    assert capture("dcgm-exporter/go-dcgm-field-names.json").is_file()
