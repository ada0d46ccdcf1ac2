"""The generated dashboards as data: what they show, where each number and name comes from, and
the traps of file provisioning avoided."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import dcgm_fields
from deployer.monitoring import dashboards
from deployer.monitoring.dashboards import of_inventory, proof
from deployer.session import DEFAULT_ROLES
from tests.unit.grafana_inventory import INVENTORY, write_inventory

CURRENT_PANEL_TYPES = {
    "timeseries",
    "stat",
    "heatmap",
    "table",
    "state-timeline",
    "bargauge",
    "row",
}
PROMETHEUS_DEFAULTS = yaml.safe_load((DEFAULT_ROLES / "prometheus/defaults/main.yml").read_text())


def generate(tmp_path: Path, *extra: str, data: dict[str, Any] | None = None):
    dashboards._built.cache_clear()
    return of_inventory.for_inventory(write_inventory(tmp_path, data), extra)


@pytest.fixture
def built(tmp_path: Path) -> dict[str, dict[str, Any]]:
    return generate(tmp_path)[1]


def panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def panel(d: dict[str, Any], title: str) -> dict[str, Any]:
    found = [p for p in d["panels"] if p.get("title") == title]
    assert found, [p.get("title") for p in d["panels"]]
    return found[0]


def red_steps(p: dict[str, Any]) -> list[float]:
    steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [s["value"] for s in steps if s["color"] == "red"]


def exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(d) for t in p.get("targets", [])]


# ---------------------------------------------------------------- the hierarchy


def test_the_four_dashboards_and_mig_where_the_inventory_has_a_mig_host(built):
    assert list(built) == [
        "gpumon-fleet", "gpumon-operations", "gpumon-node", "gpumon-capacity", "gpumon-mig",
    ]  # fmt: skip


def test_no_mig_dashboard_without_a_mig_host(tmp_path):
    data = copy.deepcopy(INVENTORY)
    del data["all"]["hosts"]["gpu03"]["gpu_mig"]
    assert "gpumon-mig" not in generate(tmp_path, data=data)[1]


def test_a_deepops_mig_manager_profile_makes_a_mig_host_unless_all_disabled(tmp_path):
    data = copy.deepcopy(INVENTORY)
    del data["all"]["hosts"]["gpu03"]["gpu_mig"]
    data["all"]["hosts"]["gpu03"]["mig_manager_profile"] = "all-disabled"
    assert "gpumon-mig" not in generate(tmp_path, data=data)[1]
    data["all"]["hosts"]["gpu03"]["mig_manager_profile"] = "all-1g.10gb"
    assert "gpumon-mig" in generate(tmp_path, data=data)[1]


def test_schema_version_is_grafana_11_6s_and_only_current_panel_types(built):
    for d in built.values():
        assert d["schemaVersion"] == 41
        assert {p["type"] for p in d["panels"]} <= CURRENT_PANEL_TYPES
        assert "graph" not in json.dumps(d["panels"]).replace('"graphMode"', "")


def test_fleet_overview_shows_health_utilization_power_alerts_and_silences(built):
    titles = {p["title"] for p in panels(built["gpumon-fleet"])}
    assert {
        "GPUs healthy", "GPUs in the inventory", "GPUs reporting", "Alerts firing",
        "Silences in force", "GPU utilization by cluster and model", "GPU power by cluster and model",
    } <= titles  # fmt: skip


def test_operations_carries_alert_and_silence_annotations(built):
    names = [a["name"] for a in built["gpumon-operations"]["annotations"]["list"]]
    assert names == ["Firing alerts", "Silences in force"]
    exprs_ = [a["expr"] for a in built["gpumon-operations"]["annotations"]["list"]]
    assert exprs_[0].startswith('ALERTS{alertstate="firing"')
    assert "alertmanager_silences" in exprs_[1]


def test_node_drill_down_selects_one_host(built):
    node = next(v for v in built["gpumon-node"]["templating"]["list"] if v["name"] == "node")
    assert node["multi"] is False and node["includeAll"] is False


# ---------------------------------------------------------------- one source for thresholds


@pytest.mark.parametrize(
    ("dashboard", "title", "keys"),
    [
        ("gpumon-operations", "GPU die temperature",
         ["prometheus_rules_gpu_temp_critical_celsius"]),
        ("gpumon-operations", "HBM memory temperature",
         ["prometheus_rules_memory_temp_critical_celsius"]),
        ("gpumon-operations", "Remapped rows and retired pages",
         ["prometheus_rules_uncorrectable_remapped_rows_threshold"]),
        ("gpumon-node", "NVLink errors", ["prometheus_rules_nvlink_crc_errors_per_second"]),
        ("gpumon-node", "Die and HBM temperature", ["prometheus_rules_gpu_temp_critical_celsius"]),
    ],
)  # fmt: skip
def test_a_panels_red_line_is_its_alerts_threshold(built, dashboard, title, keys):
    assert red_steps(panel(built[dashboard], title)) == [PROMETHEUS_DEFAULTS[k] for k in keys]


def test_the_die_temperature_warning_is_the_orange_line(built):
    steps = panel(built["gpumon-operations"], "GPU die temperature")["fieldConfig"]["defaults"]
    orange = [s["value"] for s in steps["thresholds"]["steps"] if s["color"] == "orange"]
    assert orange == [PROMETHEUS_DEFAULTS["prometheus_rules_gpu_temp_warning_celsius"]]


def test_a_count_alert_above_n_draws_its_red_line_at_the_first_count_that_fires(built):
    # GPUDoubleBitECCError: DBE > prometheus_rules_ecc_dbe_threshold (0): red from 1 error
    p = panel(built["gpumon-operations"], "Double-bit ECC errors (volatile)")
    assert red_steps(p) == [PROMETHEUS_DEFAULTS["prometheus_rules_ecc_dbe_threshold"] + 1]


def test_a_threshold_the_site_sets_for_its_replicas_moves_the_red_line(tmp_path):
    data = copy.deepcopy(INVENTORY)
    data["all"]["children"]["monitoring"]["children"]["prometheus"]["vars"] = {
        "prometheus_rules_gpu_temp_critical_celsius": 93
    }
    built = generate(tmp_path, data=data)[1]
    assert red_steps(panel(built["gpumon-operations"], "GPU die temperature")) == [93]


def test_the_pcie_threshold_series_is_the_rules_figure_per_model(built):
    p = panel(built["gpumon-node"], "PCIe replays per minute")
    threshold = p["targets"][1]["expr"]
    assert 'gpu_model="H100"' in threshold and "* 0 + 31" in threshold
    assert 'gpu_model!~"H100|H200"' in threshold and "* 0 + 16" in threshold


# ---------------------------------------------------------------- names


def test_metric_names_come_from_the_field_registry(built, monkeypatch, tmp_path):
    assert any("DCGM_FI_DEV_GPU_TEMP{" in e for e in exprs(built["gpumon-operations"]))
    field = dcgm_fields.FIELDS_BY_KEY["gpu_temp"]
    monkeypatch.setitem(
        dcgm_fields.FIELDS_BY_KEY, "gpu_temp", type(field)(**{**field.__dict__, "metric": "RENAMED_GPU_TEMP"})
    )  # fmt: skip
    renamed = generate(tmp_path)[1]
    assert any("RENAMED_GPU_TEMP{" in e for e in exprs(renamed["gpumon-operations"]))
    assert not any("DCGM_FI_DEV_GPU_TEMP" in e for e in exprs(renamed["gpumon-operations"]))


def test_legends_name_the_host_by_node_never_the_exporters_host_name(built):
    for d in built.values():
        for p in panels(d):
            for t in p.get("targets", []):
                legend = t.get("legendFormat", "")
                assert "ostname" not in legend
                if "{{gpu}}" in legend:
                    assert "{{node}}" in legend, (p["title"], legend)


def test_per_gpu_queries_drop_the_mig_and_exporter_host_labels_as_the_rules_do(built):
    expr = panel(built["gpumon-operations"], "GPU die temperature")["targets"][0]["expr"]
    assert expr.startswith("max without (GPU_I_PROFILE, GPU_I_ID, Hostname, hostname) (")


# ---------------------------------------------------------------- variables


def variables(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in d["templating"]["list"]}


def test_cluster_node_and_gpu_model_variables_all_meaning_every_series(built):
    v = variables(built["gpumon-operations"])
    assert v["node"]["multi"] and v["cluster"]["multi"] and v["gpu_model"]["multi"]
    assert {v[n]["allValue"] for n in ("cluster", "node", "gpu_model")} == {".*"}
    assert v["node"]["query"] == (
        'label_values(up{job="dcgm", cluster=~"$cluster", gpu_model=~"$gpu_model"}, node)'
    )


def test_a_slurm_fleet_gets_the_job_variable_on_the_hpc_job_label(built):
    v = variables(built["gpumon-operations"])
    assert v["hpc_job"]["query"].endswith(", hpc_job)")
    assert (
        'hpc_job=~"$hpc_job"'
        in panel(built["gpumon-operations"], "GPU die temperature")["targets"][0]["expr"]
    )


def test_no_job_variable_without_slurm(tmp_path):
    data = copy.deepcopy(INVENTORY)
    for h in data["all"]["hosts"].values():
        h.pop("slurm_partition", None)
    assert "hpc_job" not in variables(generate(tmp_path, data=data)[1]["gpumon-operations"])


def test_the_mig_dashboard_has_a_profile_variable(built):
    assert variables(built["gpumon-mig"])["mig_profile"]["query"].endswith(", GPU_I_PROFILE)")


def test_without_gpu_model_in_the_inventory_the_model_variable_reads_modelname(tmp_path):
    data = copy.deepcopy(INVENTORY)
    del data["all"]["hosts"]["gpu02"]["gpu_model"]
    v = variables(generate(tmp_path, data=data)[1]["gpumon-fleet"])
    assert v["gpu_model"]["query"].endswith(", modelName)")


# ---------------------------------------------------------------- provisioning traps


def test_no_import_placeholders_and_every_query_uses_the_datasource_variable(built):
    for d in built.values():
        text = json.dumps(d)
        assert "${DS_" not in text and "__inputs" not in text
        for p in panels(d):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])


def test_the_datasource_variable_defaults_to_a_fixed_uid(tmp_path):
    vm = "http://vm.example:8428"
    _, built = generate(tmp_path, json.dumps({"grafana_global_view_url": vm}))
    ds = variables(built["gpumon-fleet"])["datasource"]
    assert ds["current"]["value"] == "gpumon-global"
    assert ds["regex"] == "/^gpumon /"


def test_without_a_global_view_the_first_replica_is_the_default(built):
    ds = variables(built["gpumon-fleet"])["datasource"]
    assert ds["current"]["value"] == "gpumon-replica-prom01"


def test_the_same_inventory_gives_byte_identical_files(tmp_path):
    first = {u: dashboards.encode(d) for u, d in generate(tmp_path)[1].items()}
    second = {u: dashboards.encode(d) for u, d in generate(tmp_path)[1].items()}
    assert first == second


def test_the_version_is_derived_from_the_content(tmp_path):
    _, built = generate(tmp_path)
    d = built["gpumon-fleet"]
    v1 = json.loads(dashboards.encode(d))["version"]
    d["title"] = "changed"
    v2 = json.loads(dashboards.encode(d))["version"]
    assert v1 != v2 and 0 <= v1 < 2**31 and 0 <= v2 < 2**31


def test_panel_ids_are_unique_and_the_grid_is_24_columns(built):
    for d in built.values():
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in d["panels"])


# ---------------------------------------------------------------- against Grafana's schema


def test_every_dashboard_round_trips_through_the_sdks_dashboard_model(built):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for d in built.values():
        again = json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(d)))
        assert again == d


def schema_dir() -> Path:
    """Grafana 11.6's JSON schemas as grafana-foundation-sdk publishes them: the files of
    ``jsonschema/`` (dashboard.jsonschema.json and one per panel type) of its branch
    v11.6.x+cog-v0.0.x at commit aba721fdefde7979d14dbd551a6ea0d4ed14599f, the source of the PyPI
    release 1769699379!11.6.0 the dashboards are built with. No PyPI package ships them and the
    repository vendors nothing fetched: the tests read them from ``$GPUMON_GRAFANA_SCHEMA_DIR``
    or ../shared/grafana_schema/v11.6/."""
    import os

    for c in (
        os.environ.get("GPUMON_GRAFANA_SCHEMA_DIR", ""),
        str(Path(__file__).resolve().parents[3] / "shared/grafana_schema/v11.6"),
    ):
        if c and (Path(c) / "dashboard.jsonschema.json").is_file():
            return Path(c)
    pytest.skip("Grafana's JSON schemas are not here (see schema_dir's docstring)")


def test_every_dashboard_validates_against_grafanas_published_schema(built):
    import jsonschema

    schema = json.loads((schema_dir() / "dashboard.jsonschema.json").read_text())
    # The one allowance, the schema's own: the base threshold step's value is null in every
    # dashboard Grafana writes ("Nulls currently appear here when serializing -Infinity to
    # JSON", the schema's description of Threshold.value, which types it number only).
    schema["definitions"]["Threshold"]["properties"]["value"]["type"] = ["number", "null"]
    validator = jsonschema.Draft7Validator(schema)
    for uid, d in built.items():
        errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(d)]
        assert errors == [], uid


PANEL_SCHEMAS = {"timeseries": "timeseries", "stat": "stat", "heatmap": "heatmap", "table": "table",
                 "state-timeline": "statetimeline", "bargauge": "bargauge"}  # fmt: skip


def test_every_panels_options_and_field_config_validate_against_its_plugins_schema(built):
    import jsonschema

    where = schema_dir()
    for uid, d in built.items():
        for p in panels(d):
            defs = json.loads((where / f"{PANEL_SCHEMAS[p['type']]}.jsonschema.json").read_text())[
                "definitions"
            ]
            for name, data in (
                ("Options", p.get("options", {})),
                ("FieldConfig", p.get("fieldConfig", {}).get("defaults", {}).get("custom", {})),
            ):
                if name not in defs:
                    continue
                schema = {"definitions": defs, "$ref": f"#/definitions/{name}"}
                errors = [
                    e.message[:200] for e in jsonschema.Draft7Validator(schema).iter_errors(data)
                ]
                assert errors == [], (uid, p["title"], name)


# ---------------------------------------------------------------- queries as Grafana sends them


def test_all_becomes_the_variables_all_value_and_several_values_an_alternation(built):
    d = built["gpumon-operations"]
    expr = 'up{node=~"$node", cluster=~"$cluster"}[$__rate_interval]'
    got = proof.interpolate(expr, d, proof.Values({"node": ["gpu01", "gpu02"]}, "x", 15, 30))
    assert got == 'up{node=~"(gpu01|gpu02)", cluster=~".*"}[60s]'


def test_a_value_with_regex_characters_is_escaped(built):
    got = proof.interpolate('{gpu_model=~"$gpu_model"}', built["gpumon-fleet"],
                            proof.Values({"gpu_model": ["A100.40"]}))  # fmt: skip
    assert got == '{gpu_model=~"A100\\\\.40"}'


def test_every_variable_is_a_label_values_query(built):
    for d in built.values():
        names = {name for name, _match, _label in proof.variable_queries(d)}
        assert {"cluster", "gpu_model", "node"} <= names


def test_legend_labels_are_read_from_the_legend_format():
    t = proof.Target("d", "p", "timeseries", "A", "up", "{{node}} GPU {{ gpu }} {{node}}", False)
    assert t.legend_labels == ("node", "gpu")


def test_every_query_parses_as_promql_shape(built):
    # balanced brackets and no leftover Jinja: a cheap guard before the lab runs them for real
    for d in built.values():
        for e in exprs(d):
            assert e.count("(") == e.count(")") and e.count("{") == e.count("}"), e
            assert "{{" not in e and not re.search(r"\$\{?DS_", e)
