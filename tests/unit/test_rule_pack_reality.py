"""The rule pack on series shaped exactly as real dcgm-exporter scrapes: promtool tests built from
the captures in ``../shared/gpu_reality_fixtures/dcgm-exporter-metrics/``.

Each input series is a line of a real scrape (metric name and every exporter label as captured),
plus the target labels gpumon's file_sd gives that host (``deployer/monitoring/file_sd.py``: job, instance,
node, cluster, ...), as Prometheus stores it. Where a test needs a value the capture does not have
(a hot GPU, an XID), only the value changes, or a series of another field is given the label set
of a captured series of the same entity (said at each place). Exporter versions: the captures are
4.x (``Hostname``); HEAD d5e5f51 and 4.6.0-4.8.3 name it ``hostname``
(NVIDIA/dcgm-exporter ``internal/pkg/rendermetrics/render_metrics.go:47``, "#655"), so each
label-sensitive test also runs with the label renamed; the A800 capture predates ``pci_bus_id``
(exporter < 4.4.1-4.6.0), the L40S and H100 ones carry it.

Captures: ``a800_mig_535.129.03_excerpt.metrics`` (8x A800, GPU 0 in MIG mode with GPU instances
3, 5, 6), ``l40s_595.58.03_default-counters.metrics`` (L40S: no memory sensor, MEMORY_TEMP 0),
``h100x8_580.105.08_excerpt.metrics`` (8x H100, gpu-operator).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import dcgm_fields, rule_pack
from deployer.monitoring import file_sd
from tests.reality import capture_text
from tests.unit.test_rule_pack import promtool, render_rule_pack, role_defaults, run_promtool

__all__ = ["promtool"]  # the fixture, imported for the tests below

A800 = "dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics"
L40S = "dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics"
H100 = "dcgm-exporter-metrics/h100x8_580.105.08_excerpt.metrics"
VERSIONS = ["Hostname", "hostname"]  # exporter 4.x as captured; HEAD / 4.6.0-4.8.3
DROPPED = {"GPU_I_PROFILE", "GPU_I_ID", "Hostname", "hostname"}

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


# ---------------------------------------------------------------- captured series, as stored


def scrape(relpath: str, host_label: str = "Hostname") -> list[tuple[str, dict[str, str], float]]:
    """(metric, exporter labels, value) of every sample line of a captured scrape; the exporter's
    host-name label named as ``host_label`` (the version's name for it)."""
    out = []
    for line in capture_text(relpath).splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if "Hostname" in labels and host_label != "Hostname":
            labels[host_label] = labels.pop("Hostname")
        out.append((m.group("name"), labels, float(m.group("value"))))
    return out


def target_labels(node: str, **host_vars: Any) -> dict[str, str]:
    """The labels gpumon's dcgm job gives ``node``'s exporter target (file_sd) plus job and
    instance, as Prometheus attaches them."""
    defaults = role_defaults()
    variables = {
        **{k: v for k, v in defaults.items() if k.startswith(("prometheus_", "metrics_store_"))},
        "groups": {"gpu": [node], "prometheus": [], "alertmanager": []},
        "hostvars": {node: {"ansible_host": node, **host_vars}},
        "prometheus_thanos_sidecar": False,
    }
    group = file_sd.file_sd_targets(variables)["dcgm"][0]
    labels = {k: v for k, v in group["labels"].items() if not k.startswith("__")}
    return {"job": "dcgm", "instance": group["targets"][0], **labels}


GPU_HOST = {"cluster": "lab", "rack": "r1", "gpu_model": "A800", "slurm_partition": "train"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def stored(
    relpath: str,
    target: dict[str, str],
    host_label: str = "Hostname",
    only: set[str] | None = None,
    samples: int = 10,
) -> list[dict[str, str]]:
    """The capture's series as Prometheus stores them, each holding its captured value."""
    return [
        series(name, {**target, **labels}, f"{value:g}x{samples}")
        for name, labels, value in scrape(relpath, host_label)
        if only is None or name in only
    ]


def alert_labels(labels: dict[str, str], alertname: str, **extra: str) -> dict[str, str]:
    """What an alert on that series carries: the MIG and host-name labels aggregated away."""
    rule = ALERT_RULES[alertname]
    out = {k: v for k, v in labels.items() if k not in DROPPED}
    return {**out, **extra, "severity": rule["severity"], "alert_family": rule["alert_family"]}


def promtool_file(tests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rule_files": ["gpu-alerts.yml", "gpu-recording.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", **t} for t in tests],
    }


def run(promtool_path: str, tmp_path: Path, tests: list[dict[str, Any]], **overrides: Any) -> None:
    """Run the promtool tests against the rendered rule pack. These tests are about which alerts
    fire with which labels (the annotations are checked by tests/rules/*.yml): the rendered alert
    rules lose their annotations here, so expectations need not repeat them."""
    for path in render_rule_pack(role_defaults() | overrides, tmp_path):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in data["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    path = tmp_path / "reality_test.yml"
    path.write_text(yaml.safe_dump(promtool_file(tests), allow_unicode=True), encoding="utf-8")
    result = run_promtool(promtool_path, "test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def _alert_rules() -> dict[str, dict[str, str]]:
    out = {}
    text = (Path(__file__).resolve().parents[2] / "roles/prometheus/templates/rules").glob("*.j2")
    for path in text:
        for m in re.finditer(
            r"- alert: (\w+)\n(?:.*\n)*?\s+severity: (\w+)\n\s+alert_family: (\w+)",
            path.read_text(encoding="utf-8"),
        ):
            out[m.group(1)] = {"severity": m.group(2), "alert_family": m.group(3)}
    return out


ALERT_RULES = _alert_rules()


def node_labels(labels: dict[str, str]) -> dict[str, str]:
    """A GPU series' labels at node level: the per-GPU labels aggregated away."""
    gpu_level = set(role_defaults()["prometheus_rules_gpu_labels"]) | {"DCGM_FI_DRIVER_VERSION"}
    return {k: v for k, v in labels.items() if k not in DROPPED | gpu_level}


def exp(labels: dict[str, str]) -> dict[str, Any]:
    return {"exp_labels": labels}


def gpu0_instances(host_label: str) -> list[dict[str, str]]:
    """The exporter labels of the A800 capture's GPU 0 instances (its MEMORY_TEMP lines)."""
    return [
        labels
        for name, labels, _v in scrape(A800, host_label)
        if name == "DCGM_FI_DEV_MEMORY_TEMP" and labels["gpu"] == "0"
    ]


def gpu1(host_label: str) -> dict[str, str]:
    return next(
        labels
        for name, labels, _v in scrape(A800, host_label)
        if name == "DCGM_FI_DEV_MEMORY_TEMP" and labels["gpu"] == "1"
    )


# ---------------------------------------------------------------- MIG: the A800 capture


def test_the_a800_capture_is_mig_shaped_as_the_tests_assume():
    instances = gpu0_instances("Hostname")
    assert [i["GPU_I_ID"] for i in instances] == ["3", "5", "6"]
    names = {(n, lb["gpu"]) for n, lb, _v in scrape(A800)}
    assert ("DCGM_FI_DEV_GPU_UTIL", "0") not in names  # no utilization for a MIG GPU
    assert ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0") not in names
    assert ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1") in names


@pytest.mark.parametrize("host_label", VERSIONS)
def test_node_power_counts_each_mig_gpu_once(promtool, tmp_path, host_label):
    target = target_labels("gpu01", **GPU_HOST)
    node = node_labels({**target, **gpu1(host_label)})
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": stored(A800, target, host_label, {"DCGM_FI_DEV_POWER_USAGE"}),
                "promql_expr_test": [
                    # 78.446 (the largest of GPU 0's three instance readings) + 55.942, not 290.736
                    {
                        "expr": "node:gpu_power_usage_watts:sum",
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": "node:gpu_power_usage_watts:sum"
                                + "{"
                                + ",".join(f'{k}="{v}"' for k, v in sorted(node.items()))
                                + "}",
                                "value": 134.388,
                            }
                        ],
                    },
                    {
                        "expr": "count(gpu:gpu_power_usage_watts:max)",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": "{}", "value": 2}],
                    },
                ],
            }
        ],
    )


@pytest.mark.parametrize("host_label", VERSIONS)
def test_one_xid_on_a_mig_gpu_fires_one_alert(promtool, tmp_path, host_label):
    target = target_labels("gpu01", **GPU_HOST)
    window = {"window_size_in_ms": "300000"}
    # The XID collector emits, per monitored entity (each GPU instance of a MIG GPU), the parent
    # GPU's count with labels xid and window_size_in_ms, and a zero series without xid for a GPU
    # with none (expcollector.go:90-103 @ 691c927): given the captured entities' label sets.
    xid = [
        series("DCGM_EXP_XID_ERRORS_COUNT", {**target, **lb, **window, "xid": "79"}, "0 1x9")
        for lb in gpu0_instances(host_label)
    ] + [series("DCGM_EXP_XID_ERRORS_COUNT", {**target, **gpu1(host_label), **window}, "0x10")]
    labels = {**target, **gpu0_instances(host_label)[0], **window, "xid": "79"}
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": xid,
                "alert_rule_test": [
                    {"eval_time": "0m", "alertname": "GPUXidCritical", "exp_alerts": []},
                    {
                        "eval_time": "2m",
                        "alertname": "GPUXidCritical",
                        "exp_alerts": [exp(alert_labels(labels, "GPUXidCritical"))],
                    },
                ],
            }
        ],
    )


@pytest.mark.parametrize("host_label", VERSIONS)
def test_utilization_averages_include_the_mig_gpu(promtool, tmp_path, host_label):
    target = target_labels("gpu01", **GPU_HOST)
    # GPU 0's instances (2g.20gb each: 2 of 7 compute slices) at 87.5 %, 50 % and 37.5 %
    # graphics activity: 2 x (0.875 + 0.5 + 0.375) / 7 = 50 % of the GPU; GPU 1 (not in MIG
    # mode) at its captured 0 %: the node at 25 %.
    activity = [
        series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {**target, **lb}, f"{v}x10")
        for lb, v in zip(gpu0_instances(host_label), ("0.875", "0.5", "0.375"), strict=True)
    ]
    gpu0 = {
        k: v for k, v in {**target, **gpu0_instances(host_label)[0]}.items() if k not in DROPPED
    }
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": activity
                + stored(A800, target, host_label, {"DCGM_FI_DEV_GPU_UTIL"}),
                "promql_expr_test": [
                    {
                        "expr": 'gpu:gpu_utilization:percent{gpu="0"}',
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": "gpu:gpu_utilization:percent{"
                                + ",".join(f'{k}="{v}"' for k, v in sorted(gpu0.items()))
                                + "}",
                                "value": 50,
                            }
                        ],
                    },
                    {
                        "expr": "sum(node:gpu_utilization:avg)",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": "{}", "value": 25}],
                    },
                ],
            }
        ],
    )


@pytest.mark.parametrize("host_label", VERSIONS)
def test_a_hot_hbm_on_a_mig_gpu_fires_one_alert(promtool, tmp_path, host_label):
    target = target_labels("gpu01", **GPU_HOST)
    captured = stored(A800, target, host_label, {"DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP"})
    # GPU 0's memory (each instance series repeats the GPU's reading) at 95 degC
    hot = [
        {**s, "values": "95x10"} if 'gpu="0"' in s["series"] and "MEMORY_TEMP" in s["series"] else s
        for s in captured
    ]
    labels = {**target, **gpu0_instances(host_label)[0]}
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": captured,
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "GPUMemoryTemperatureHigh", "exp_alerts": []},
                    {
                        "eval_time": "10m",
                        "alertname": "GPUMemoryTemperatureMissing",
                        "exp_alerts": [],
                    },
                ],
            },
            {
                "input_series": hot,
                "alert_rule_test": [
                    {
                        "eval_time": "3m",
                        "alertname": "GPUMemoryTemperatureHigh",
                        "exp_alerts": [exp(alert_labels(labels, "GPUMemoryTemperatureHigh"))],
                    }
                ],
            },
        ],
    )


@pytest.mark.parametrize(
    "shape", ["per GPU instance (DCGM answers from the parent GPU)", "per GPU (exporter -d g)"]
)
def test_a_row_remap_failure_on_a_mig_gpu_fires_one_alert(promtool, tmp_path, shape):
    target = target_labels("gpu01", **GPU_HOST)
    if shape.startswith("per GPU instance"):
        entities = gpu0_instances("Hostname")
    else:
        entities = [{k: v for k, v in gpu0_instances("Hostname")[0].items() if k not in DROPPED}]
    failed = [series("DCGM_FI_DEV_ROW_REMAP_FAILURE", {**target, **lb}, "0 1x9") for lb in entities]
    captured = stored(A800, target, only={"DCGM_FI_DEV_ROW_REMAP_FAILURE"})
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": captured,  # as captured: GPU 1 remapped fine, GPU 0 no series
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "GPURowRemapFailure", "exp_alerts": []}
                ],
            },
            {
                "input_series": captured + failed,
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "GPURowRemapFailure",
                        "exp_alerts": [
                            exp(alert_labels({**target, **entities[0]}, "GPURowRemapFailure"))
                        ],
                    }
                ],
            },
        ],
    )


# Every per-GPU alert on GPU-level fields, fed the way dcgm-exporter reports a MIG GPU: one series
# per GPU instance repeating the GPU's value (the A800 capture's GPU 0 instance label sets).
PER_GPU_ON_MIG = [
    ("GPUTemperatureCritical", {"gpu_temp": "95x10"}, "3m"),
    ("GPUTemperatureHigh", {"gpu_temp": "88x10"}, "6m"),
    ("GPUDoubleBitECCError", {"ecc_dbe_volatile": "1x10"}, "1m"),
    ("GPUUncorrectableRemappedRowsHigh", {"uncorrectable_remapped_rows": "512x10"}, "1m"),
    ("GPURetiredPagesHigh", {"retired_sbe": "40x10", "retired_dbe": "30x10"}, "1m"),
    ("GPUThermalThrottling", {"clocks_event_reasons": "32x15"}, "11m"),
    ("GPUPowerThrottling", {"clocks_event_reasons": "128x15"}, "11m"),
    ("GPUHardwareSlowdown", {"clocks_event_reasons": "8x15"}, "11m"),
    ("GPUPCIeReplayRateHigh", {"pcie_replay": "0+30x10"}, "6m"),
    ("GPUNVLinkReplayErrors", {"nvlink_replay_errors": "0 0 1x8"}, "3m"),
    ("GPUNVLinkRecoveryErrors", {"nvlink_recovery_errors": "0 0 1x8"}, "3m"),
    ("GPUNVLinkCRCErrorFlood", {"nvlink_crc_flit_errors": "0+6000x10"}, "5m"),
]


@pytest.mark.parametrize(
    ("alertname", "fields", "eval_time"),
    PER_GPU_ON_MIG,
    ids=lambda v: v if isinstance(v, str) and v[0].isupper() else "",
)
def test_a_gpu_level_fault_on_a_mig_gpu_fires_one_alert(
    promtool, tmp_path, alertname, fields, eval_time
):
    target = target_labels("gpu01", **GPU_HOST)
    inputs = [
        series(dcgm_fields.metric(key), {**target, **lb}, values)
        for key, values in fields.items()
        for lb in gpu0_instances("Hostname")
    ]
    labels = alert_labels({**target, **gpu0_instances("Hostname")[0]}, alertname)
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": eval_time, "alertname": alertname, "exp_alerts": [exp(labels)]}
                ],
            }
        ],
    )


@pytest.mark.parametrize(("expected", "fires"), [(2, False), (3, True)])
def test_gpus_are_counted_by_uuid_not_by_series(promtool, tmp_path, expected, fires):
    target = target_labels("gpu01", **GPU_HOST)
    node_target = {**target, "job": "node", "instance": "gpu01:9100"}
    inputs = [
        *stored(A800, target, only={"DCGM_FI_DEV_GPU_TEMP"}),
        series("gpumon_expected_gpus", node_target, f"{expected}x10"),
        series("up", target, "1x10"),
    ]
    labels = {k: target[k] for k in ("cluster", "node", "instance")}
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": inputs,
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "GPUMissing",
                        "exp_alerts": [exp(alert_labels(labels, "GPUMissing"))] if fires else [],
                    }
                ],
            }
        ],
    )


# ---------------------------------------------------------------- sensorless: the L40S capture


L40S_HOST = {"cluster": "lab", "gpu_model": "L40S"}


def test_the_l40s_capture_reports_memory_temperature_0():
    temps = [v for n, _lb, v in scrape(L40S) if n == "DCGM_FI_DEV_MEMORY_TEMP"]
    assert temps == [0.0]


@pytest.mark.parametrize("host_label", VERSIONS)
def test_a_board_without_a_memory_sensor_is_not_missing_one(promtool, tmp_path, host_label):
    target = target_labels("inf01", **L40S_HOST)
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": stored(L40S, target, host_label),
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "GPUMemoryTemperatureMissing",
                        "exp_alerts": [],
                    }
                ],
                "promql_expr_test": [
                    {
                        "expr": "node:gpu_memory_temperature_celsius:max",
                        "eval_time": "5m",
                        "exp_samples": [],
                    }
                ],
            }
        ],
    )


def test_hbm_thresholds_are_never_applied_to_a_board_without_a_memory_sensor(promtool, tmp_path):
    target = target_labels("inf01", **L40S_HOST)
    # even a threshold of 0 degC: the board's 0 is no reading, and its model has no sensor
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": stored(L40S, target),
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "GPUMemoryTemperatureHigh", "exp_alerts": []}
                ],
            }
        ],
        prometheus_rules_memory_temp_critical_celsius=0,
    )


@pytest.mark.parametrize("host_label", VERSIONS)
def test_an_hbm_board_reporting_0_is_missing_its_memory_temperature(promtool, tmp_path, host_label):
    target = target_labels("gpu02", cluster="lab", gpu_model="H100")
    captured = stored(H100, target, host_label)
    # the H100 excerpt's GPU_TEMP label sets with a MEMORY_TEMP of 0: a sensor that reads nothing
    zero = [
        series("DCGM_FI_DEV_MEMORY_TEMP", {**target, **lb}, "0x10")
        for n, lb, _v in scrape(H100, host_label)
        if n == "DCGM_FI_DEV_GPU_TEMP"
    ]
    expected = [
        exp(alert_labels({**target, **lb}, "GPUMemoryTemperatureMissing"))
        for n, lb, _v in scrape(H100, host_label)
        if n == "DCGM_FI_DEV_GPU_TEMP"
    ]
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": captured + zero,
                "alert_rule_test": [
                    {
                        "eval_time": "6m",
                        "alertname": "GPUMemoryTemperatureMissing",
                        "exp_alerts": expected,
                    }
                ],
            }
        ],
    )


def test_the_sensorless_models_are_the_exporters_model_names():
    names = rule_pack.template_values()["sensorless_models"]
    captured = {lb["modelName"] for _n, lb, _v in scrape(L40S)}
    assert captured <= set(names)
    assert not {lb["modelName"] for _n, lb, _v in scrape(H100)} & set(names)
    assert not {lb["modelName"] for _n, lb, _v in scrape(A800)} & set(names)


# ---------------------------------------------------------------- labels: the H100 capture


@pytest.mark.parametrize("host_label", VERSIONS)
def test_gpu_alerts_carry_the_file_sd_identity_and_no_exporter_host_name(
    promtool, tmp_path, host_label
):
    target = target_labels("gpu02", cluster="lab", gpu_model="H100", rack="r2")
    captured = stored(H100, target, host_label, {"DCGM_FI_DEV_GPU_TEMP"})
    hot = [{**s, "values": "95x10"} if 'gpu="6"' in s["series"] else s for s in captured]
    gpu6 = next(lb for n, lb, _v in scrape(H100, host_label) if lb["gpu"] == "6")
    labels = alert_labels({**target, **gpu6}, "GPUTemperatureCritical")
    assert host_label not in labels
    assert set(rule_pack.identity_labels("GPUTemperatureCritical")) <= set(labels)
    run(
        promtool,
        tmp_path,
        [
            {
                "input_series": hot,
                "alert_rule_test": [
                    {
                        "eval_time": "3m",
                        "alertname": "GPUTemperatureCritical",
                        "exp_alerts": [exp(labels)],
                    }
                ],
            }
        ],
    )
