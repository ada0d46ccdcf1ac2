"""The prometheus role's rule pack: rendered with the role defaults, valid for promtool, and
every alert and recording rule proven by promtool unit tests (tests/rules/*.yml) to fire
or produce, and to stay quiet, on the data it is meant for.

The rule templates are rendered exactly as the engine renders templates (the Jinja
environment in the shared contracts) with the variables of roles/prometheus/defaults.
promtool comes from Debian's `prometheus` package (2.42.0); without it these tests skip,
unless CI is set, where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.errors import InputError
from deployer.templating import Renderer, TemplatedVars, make_environment

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "prometheus"
TEMPLATES = ROLE / "templates" / "rules"
DEFAULTS = ROLE / "defaults" / "main.yml"
PROMTOOL_TESTS = REPO / "tests" / "rules"

RECORD_NAME = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")


# --- helpers -----------------------------------------------------------------------------


def role_defaults() -> dict[str, Any]:
    with DEFAULTS.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def templates() -> list[Path]:
    return sorted(TEMPLATES.glob("*.yml.j2"))


def promtool_test_files() -> list[Path]:
    return sorted(PROMTOOL_TESTS.glob("*.yml"))


def render_rule_pack(variables: dict[str, Any], outdir: Path) -> list[Path]:
    """Render every rule template into outdir (name without .j2) as the engine does: its Jinja
    environment and globals (the field registry's metric names, the rule pack's model facts),
    role defaults that are templates themselves resolved on use."""
    renderer = Renderer(make_environment([TEMPLATES]))
    values = TemplatedVars(variables, renderer)
    outdir.mkdir(parents=True, exist_ok=True)
    rendered = []
    for template in templates():
        target = outdir / template.name.removesuffix(".j2")
        target.write_text(renderer.render_file(template, values), encoding="utf-8")
        rendered.append(target)
    return rendered


def run_promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def rules_of(rule_files: list[Path], kind: str) -> dict[str, dict[str, Any]]:
    """Rules of one kind ("alert" or "record") by name, from rendered rule files."""
    found: dict[str, dict[str, Any]] = {}
    for path in rule_files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                if kind in rule:
                    found[rule[kind]] = rule
    return found


def alert_cases() -> Iterator[tuple[str, bool]]:
    """(alertname, fires) for every alert_rule_test case of the promtool test files."""
    for path in promtool_test_files():
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for case in group.get("alert_rule_test") or []:
                yield case["alertname"], bool(case.get("exp_alerts"))


def record_cases() -> Iterator[tuple[str, bool]]:
    """(metric name queried, produces samples) for every promql_expr_test case."""
    for path in promtool_test_files():
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for case in group.get("promql_expr_test") or []:
                match = RECORD_NAME.match(case["expr"])
                if match:
                    yield match.group(1), bool(case.get("exp_samples"))


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        reason = (
            "promtool not found: install Debian's prometheus package (apt-get install prometheus)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so the rule pack must be tested")
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return render_rule_pack(role_defaults(), tmp_path_factory.mktemp("rules"))


# --- the rendered rule files ---------------------------------------------------------------


def test_rule_pack_has_gpu_meta_and_recording_templates() -> None:
    assert [t.name for t in templates()] == [
        "global-federation.yml.j2",
        "gpu-alerts.yml.j2",
        "gpu-recording.yml.j2",
        "meta-alerts.yml.j2",
        "shard-recording.yml.j2",
    ]


@pytest.mark.parametrize("template", templates(), ids=lambda p: p.name)
def test_rendered_rule_file_passes_promtool_check(
    promtool: str, rendered: list[Path], template: Path
) -> None:
    rule_file = next(p for p in rendered if p.name == template.name.removesuffix(".j2"))
    result = run_promtool(promtool, "check", "rules", "--lint=all", "--lint-fatal", rule_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_severity_summary_description_and_runbook(rendered: list[Path]) -> None:
    alerts = rules_of(rendered, "alert")
    assert alerts
    for name, rule in alerts.items():
        assert rule.get("labels", {}).get("severity") in {"critical", "warning"}, name
        for annotation in ("summary", "description", "runbook"):
            assert rule.get("annotations", {}).get(annotation), f"{name} lacks {annotation}"


def test_prometheus_templating_survives_jinja_rendering(rendered: list[Path]) -> None:
    rule = rules_of(rendered, "alert")["GPUMemoryTemperatureHigh"]
    assert "{{ $labels.node }}" in rule["annotations"]["summary"]
    assert "{{ $value }}" in rule["annotations"]["description"]
    assert "{%" not in "".join(p.read_text(encoding="utf-8") for p in rendered)


# the shard's levels, and the records at the shard boundary (cluster_model) and the federation
# tier's global pair's (global_*)
LEVELS = {"gpu", "node", "cluster", "gpu_hpc_job", "hpc_job", "cluster_model"} | {
    "global_cluster_model",
    "global_cluster",
    "global_shard",
}


def test_recording_rules_are_named_level_metric_operations(rendered: list[Path]) -> None:
    records = rules_of(rendered, "record")
    assert records
    for name in records:
        level, metric, operations = name.split(":")
        assert level in LEVELS and metric and operations, name


def test_xid_alerts_use_the_windowed_count_not_the_last_code_gauge(rendered: list[Path]) -> None:
    exprs = " ".join(rule["expr"] for rule in rules_of(rendered, "alert").values())
    assert "DCGM_EXP_XID_ERRORS_COUNT" in exprs
    assert "DCGM_FI_DEV_XID_ERRORS" not in exprs


def test_every_rule_pack_variable_is_used_by_a_template() -> None:
    text = "".join(t.read_text(encoding="utf-8") for t in templates())
    unused = [k for k in role_defaults() if k.startswith("prometheus_rules_") and k not in text]
    assert unused == []


# --- promtool unit tests -----------------------------------------------------------------


@pytest.mark.parametrize("test_file", promtool_test_files(), ids=lambda p: p.name)
def test_promtool_unit_tests_pass_against_rendered_rules(
    promtool: str, rendered: list[Path], test_file: Path
) -> None:
    workdir = rendered[0].parent
    shutil.copy(test_file, workdir / test_file.name)
    result = run_promtool(promtool, "test", "rules", workdir / test_file.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_promtool_case(rendered: list[Path]) -> None:
    cases = set(alert_cases())
    missing = [
        f"{name} ({'fires' if fires else 'stays quiet'})"
        for name in sorted(rules_of(rendered, "alert"))
        for fires in (True, False)
        if (name, fires) not in cases
    ]
    assert missing == []


def test_every_recording_rule_has_a_producing_and_an_empty_promtool_case(
    rendered: list[Path],
) -> None:
    cases = set(record_cases())
    missing = [
        f"{name} ({'produces' if produces else 'produces nothing'})"
        for name in sorted(rules_of(rendered, "record"))
        for produces in (True, False)
        if (name, produces) not in cases
    ]
    assert missing == []


def test_promtool_cases_name_only_rules_that_exist(rendered: list[Path]) -> None:
    alerts = rules_of(rendered, "alert")
    records = rules_of(rendered, "record")
    assert {name for name, _ in alert_cases()} - alerts.keys() == set()
    assert {name for name, _ in record_cases()} - records.keys() == set()


# --- thresholds are variables ------------------------------------------------------------

GPU0 = {
    "job": "dcgm",
    "instance": "gpu01:9400",
    "node": "gpu01",
    "gpu": "0",
    "UUID": "GPU-0100",
    "modelName": "NVIDIA H100 80GB HBM3",
}
# an HBM board the model data does not list: a site exempts it by its gpu_model label
H20 = GPU0 | {
    "instance": "inf01:9400",
    "node": "inf01",
    "gpu_model": "H20",
    "modelName": "NVIDIA H20",
}
DRAIN_FOR_HBM = (
    "Drain gpu01 now: HBM slows down at its max operating temperature and is damaged above "
    "it. Check cooling; the core temperature can look normal while the memory overheats."
)


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def one_alert_test(
    input_series: list[dict[str, str]], alertname: str, eval_time: str, exp_alerts: list[Any]
) -> dict[str, Any]:
    return {
        "rule_files": ["gpu-alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series,
                "alert_rule_test": [
                    {"eval_time": eval_time, "alertname": alertname, "exp_alerts": exp_alerts}
                ],
            }
        ],
    }


# (id, overrides, a promtool test that passes with the overrides and fails with the defaults)
OVERRIDE_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "memory-temperature threshold, margin and duration",
        {
            "prometheus_rules_memory_temp_critical_celsius": 70,
            "prometheus_rules_memory_temp_margin_celsius": 3,
            "prometheus_rules_memory_temp_for": "1m",
        },
        one_alert_test(
            [series("DCGM_FI_DEV_MEMORY_TEMP", GPU0, "75x5")],
            "GPUMemoryTemperatureHigh",
            "1m",
            [
                {
                    "exp_labels": GPU0
                    | {"severity": "critical", "alert_family": "gpu_temperature"},
                    "exp_annotations": {
                        "summary": "GPU memory (HBM) of GPU 0 on gpu01 at 75 °C",
                        "description": "The memory of GPU 0 (GPU-0100, NVIDIA H100 80GB HBM3) on "
                        "gpu01 is at 75 °C, at or above 70 °C or its own memory max operating "
                        "temperature minus 3 °C, for 1m.",
                        "runbook": DRAIN_FOR_HBM,
                    },
                }
            ],
        ),
    ),
    (
        "GPU temperature warning threshold",
        {"prometheus_rules_gpu_temp_warning_celsius": 70},
        one_alert_test(
            [series("DCGM_FI_DEV_GPU_TEMP", GPU0, "75x10")],
            "GPUTemperatureHigh",
            "6m",
            [
                {
                    "exp_labels": GPU0 | {"severity": "warning", "alert_family": "gpu_temperature"},
                    "exp_annotations": {
                        "summary": "GPU 0 on gpu01 at 75 °C",
                        "description": "GPU 0 (GPU-0100, NVIDIA H100 80GB HBM3) on gpu01 is at "
                        "75 °C, above 70 °C for 5m.",
                        "runbook": "Check the node's fans, inlet temperature and airflow; a single "
                        "hot GPU in a cool node points at its heatsink or thermal paste.",
                    },
                }
            ],
        ),
    ),
    (
        "critical XID list",
        {"prometheus_rules_xid_critical": [13]},
        one_alert_test(
            [
                series(
                    "DCGM_EXP_XID_ERRORS_COUNT",
                    GPU0 | {"xid": "13", "window_size_in_ms": "300000"},
                    "1x5",
                )
            ],
            "GPUXidCritical",
            "1m",
            [
                {
                    "exp_labels": GPU0
                    | {
                        "severity": "critical",
                        "alert_family": "gpu_xid",
                        "xid": "13",
                        "window_size_in_ms": "300000",
                    },
                    "exp_annotations": {
                        "summary": "XID 13 on gpu01 GPU 0",
                        "description": "GPU 0 (GPU-0100, NVIDIA H100 80GB HBM3) on gpu01 raised "
                        "XID 13 1 time(s) in the exporter's last 300000 ms.",
                        "runbook": "Look XID 13 up in NVIDIA's XID catalog. Drain gpu01; 79 (fell "
                        "off the bus): reboot the node; 48/64/95/140 (ECC): reset the GPU; "
                        "74/136/144-150 (NVLink): reset the GPU and check its peers.",
                    },
                }
            ],
        ),
    ),
    (
        "dcgm job name and exporter-down duration",
        {"prometheus_rules_job_dcgm": "gpu-exporter", "prometheus_rules_exporter_down_for": "1m"},
        one_alert_test(
            [
                series(
                    "up", {"job": "gpu-exporter", "instance": "gpu01:9400", "node": "gpu01"}, "0x5"
                )
            ],
            "DCGMExporterDown",
            "2m",
            [
                {
                    "exp_labels": {
                        "severity": "critical",
                        "alert_family": "gpu_exporter",
                        "job": "gpu-exporter",
                        "instance": "gpu01:9400",
                        "node": "gpu01",
                    },
                    "exp_annotations": {
                        "summary": "dcgm-exporter on gpu01 is down",
                        "description": "Prometheus cannot scrape dcgm-exporter at gpu01:9400 for "
                        "1m: no GPU of that node is monitored.",
                        "runbook": "On gpu01: systemctl status nvidia-dcgm-exporter nvidia-dcgm; "
                        "journalctl -u nvidia-dcgm-exporter; check that nv-hostengine answers on "
                        "localhost:5555.",
                    },
                }
            ],
        ),
    ),
    (
        "models exempt from the missing memory temperature alert",
        {"prometheus_rules_memory_temp_exempt_models": ["H20", "L4"]},
        one_alert_test(
            [series("DCGM_FI_DEV_GPU_TEMP", H20, "50x10")], "GPUMemoryTemperatureMissing", "10m", []
        ),
    ),
    (
        "thermal throttling bits",
        {"prometheus_rules_throttle_thermal_bits": [6]},
        one_alert_test(
            [series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GPU0, "32x15")],
            "GPUThermalThrottling",
            "11m",
            [],
        ),
    ),
]


@pytest.mark.parametrize(
    ("overrides", "promtool_test"),
    [c[1:] for c in OVERRIDE_CASES],
    ids=[c[0] for c in OVERRIDE_CASES],
)
def test_overridden_variable_changes_what_fires(
    promtool: str, tmp_path: Path, overrides: dict[str, Any], promtool_test: dict[str, Any]
) -> None:
    render_rule_pack(role_defaults() | overrides, tmp_path)
    test_file = tmp_path / "override_test.yml"
    test_file.write_text(yaml.safe_dump(promtool_test, allow_unicode=True), encoding="utf-8")
    result = run_promtool(promtool, "test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("overrides", "promtool_test"),
    [c[1:] for c in OVERRIDE_CASES],
    ids=[c[0] for c in OVERRIDE_CASES],
)
def test_the_same_data_under_the_defaults_fires_differently(
    promtool: str, tmp_path: Path, overrides: dict[str, Any], promtool_test: dict[str, Any]
) -> None:
    render_rule_pack(role_defaults(), tmp_path)
    test_file = tmp_path / "override_test.yml"
    test_file.write_text(yaml.safe_dump(promtool_test, allow_unicode=True), encoding="utf-8")
    result = run_promtool(promtool, "test", "rules", test_file)
    alertname = promtool_test["tests"][0]["alert_rule_test"][0]["alertname"]
    assert result.returncode == 1
    assert f"alertname: {alertname}," in result.stdout + result.stderr


def test_pcie_limits_per_model_become_selectors(tmp_path: Path) -> None:
    overrides = {"prometheus_rules_pcie_replays_per_minute_by_model": {"B200": 31}}
    rendered = render_rule_pack(role_defaults() | overrides, tmp_path)
    expr = rules_of(rendered, "alert")["GPUPCIeReplayRateHigh"]["expr"]
    assert 'gpu_model="B200"' in expr and "> 31" in expr
    assert 'gpu_model!~"B200"' in expr and "> 16" in expr


def test_pcie_limit_without_per_model_overrides_applies_to_every_gpu(tmp_path: Path) -> None:
    overrides = {"prometheus_rules_pcie_replays_per_minute_by_model": {}}
    rendered = render_rule_pack(role_defaults() | overrides, tmp_path)
    expr = rules_of(rendered, "alert")["GPUPCIeReplayRateHigh"]["expr"]
    assert "gpu_model" not in expr
    assert expr.strip() == (
        "max without (GPU_I_PROFILE, GPU_I_ID, Hostname, hostname, hpc_job) "
        "(rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m])) * 60 > 16"
    )


def test_a_missing_variable_fails_rendering(tmp_path: Path) -> None:
    variables = role_defaults()
    del variables["prometheus_rules_memory_temp_critical_celsius"]
    with pytest.raises(InputError, match="prometheus_rules_memory_temp_critical"):
        render_rule_pack(variables, tmp_path)


# --- metric names come from the field registry ---------------------------------------------


def test_rule_templates_name_no_dcgm_field_themselves() -> None:
    # every DCGM_FI_* / DCGM_EXP_* name reaches the rules from deployer/dcgm_fields.py
    for template in templates():
        text = template.read_text(encoding="utf-8")
        assert not re.findall(r"DCGM_(?:FI|EXP)_[A-Z0-9_]+", text), template.name


def test_a_rename_in_the_field_registry_renames_the_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deployer import dcgm_fields

    monkeypatch.setitem(dcgm_fields.METRICS, "gpu_temp", "DCGM_FI_DEV_GPU_TEMP_CELSIUS")
    rendered = render_rule_pack(role_defaults(), tmp_path)
    expr = rules_of(rendered, "alert")["GPUTemperatureCritical"]["expr"]
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS < 1e6" in expr
    assert "DCGM_FI_DEV_GPU_TEMP " not in " ".join(
        r["expr"] for r in rules_of(rendered, "alert").values()
    )


def test_every_alert_has_an_identity_and_a_family(rendered: list[Path]) -> None:
    from deployer import rule_pack

    alerts = rules_of(rendered, "alert")
    assert set(alerts) == set(rule_pack.ALERT_SCOPES)
    for name, rule in alerts.items():
        assert rule["labels"].get("alert_family"), name
