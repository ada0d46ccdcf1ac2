"""The rule pack and dcgm-exporter's job label (hpc_job): which alerts carry it as a label, which
name the jobs in their description only, and that every per-GPU aggregation drops it. What fires
on which series is proven by promtool in tests/rules/gpu-jobs_test.yml."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer import rule_pack
from tests.unit.test_rule_pack import render_rule_pack, role_defaults, rules_of


@pytest.fixture(scope="module")
def alerts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return rules_of(render_rule_pack(role_defaults(), tmp_path_factory.mktemp("r")), "alert")


def gpu_alerts(alerts: dict) -> dict:
    return {n: r for n, r in alerts.items() if rule_pack.ALERT_SCOPES[n] == "gpu"}


def test_the_rules_keep_the_exporters_label_name():
    # NVIDIA/dcgm-exporter internal/pkg/transformation/const.go:27 @691c927
    assert rule_pack.JOB_LABEL == "hpc_job"


def test_gpu_alerts_without_for_carry_the_gpus_jobs_as_a_label(alerts):
    carrying = {n for n, r in gpu_alerts(alerts).items() if "hpc_job" in r["labels"]}
    assert carrying == {n for n, r in gpu_alerts(alerts).items() if "for" not in r}
    assert len(carrying) == 10
    label = alerts["GPUXidCritical"]["labels"]["hpc_job"]
    assert 'sortByLabel "hpc_job"' in label and "$labels.UUID" in label


def test_no_alert_with_for_has_an_identity_that_changes_with_the_job(alerts):
    # labels are an alert's identity (prometheus rules/alerting.go:372-383 @v2.42.0): a job
    # change would restart the for of a hot GPU
    for name, rule in alerts.items():
        if "for" in rule:
            assert "hpc_job" not in rule["labels"], name


def test_every_gpu_alert_names_its_jobs_in_the_description(alerts):
    for name, rule in gpu_alerts(alerts).items():
        assert rule["annotations"]["description"].endswith(
            '| sortByLabel "hpc_job" }} Job(s) on it: {{ range $i, $s := . }}{{ if $i }}, '
            '{{ end }}{{ label "hpc_job" $s }}{{ end }}.{{ end }}'
        ), name


def test_host_and_cluster_alerts_know_nothing_of_jobs(alerts):
    for name, rule in alerts.items():
        if rule_pack.ALERT_SCOPES[name] != "gpu":
            assert "hpc_job" not in str(rule["labels"]) + str(rule["annotations"]), name


def test_every_per_gpu_aggregation_drops_the_job(alerts):
    for name, rule in gpu_alerts(alerts).items():
        for part in rule["expr"].split("without (")[1:]:
            dropped = part.split(")")[0]
            if "GPU_I_PROFILE" in dropped:
                assert "hpc_job" in dropped, name


def test_the_label_can_be_kept_off_alerts(tmp_path: Path):
    rendered = render_rule_pack(role_defaults() | {"prometheus_rules_alerts_carry_job": False},
                                tmp_path)  # fmt: skip
    for name, rule in rules_of(rendered, "alert").items():
        assert "hpc_job" not in rule["labels"], name
