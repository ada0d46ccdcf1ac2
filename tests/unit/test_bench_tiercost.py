"""bench.tiercost's counting, on real dcgm-exporter scrapes from ../shared (never on a copy)."""

from __future__ import annotations

import pytest

from bench.tiercost import own_metrics, replica_cost, scrape_cost
from tests.reality import capture_text

L40S = "dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics"
A800_MIG = "dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics"


def test_the_real_l40s_default_scrape_is_23_series_of_its_one_gpu():
    text = capture_text(L40S)
    cost = scrape_cost(text, field_list="default", host="real")
    assert (cost.gpus, cost.series, cost.gpu_series) == (1, 23, 23)
    assert cost.series_per_gpu == 23
    assert cost.bytes == len(text.encode())
    assert 200 < cost.bytes_per_series < 400  # HELP, TYPE and ~240 bytes of labels per sample


def test_a_mig_instance_s_series_count_to_its_physical_gpu():
    cost = scrape_cost(capture_text(A800_MIG), field_list="x", host="real")
    lines = [ln for ln in capture_text(A800_MIG).splitlines() if ln and not ln.startswith("#")]
    assert cost.gpu_series == len(lines)
    assert cost.gpus == len({ln.split('gpu="')[1].split('"')[0] for ln in lines})


def test_a_replica_s_cost_is_cpu_seconds_and_samples_over_the_window():
    before = {"process_cpu_seconds_total": 10.0, "prometheus_tsdb_head_samples_appended_total": 0.0,
              "prometheus_tsdb_head_series": 9000.0, "process_resident_memory_bytes": 0.0}  # fmt: skip
    after = {"process_cpu_seconds_total": 16.0, "prometheus_tsdb_head_samples_appended_total": 12000.0,
             "prometheus_tsdb_head_series": 10000.0, "process_resident_memory_bytes": 200 * 2**20}  # fmt: skip
    r = replica_cost("prom01", before, after, 60.0)
    assert r.cpu_cores == pytest.approx(0.1)
    assert r.samples_per_s == pytest.approx(200.0)
    assert r.cpu_millicores_per_1k_series == pytest.approx(10.0)
    assert r.rss_mib_per_1k_series == pytest.approx(20.0)
    assert r.cpu_millicores_per_1k_samples_s == pytest.approx(500.0)


def test_own_metrics_sums_a_metric_over_its_labels_and_ignores_the_rest():
    text = (
        "# HELP x y\nprocess_cpu_seconds_total 1.5\n"
        'prometheus_tsdb_head_samples_appended_total{type="float"} 10\n'
        'prometheus_tsdb_head_samples_appended_total{type="histogram"} 2\nother 7\n'
    )
    got = own_metrics(
        text, ["process_cpu_seconds_total", "prometheus_tsdb_head_samples_appended_total"]
    )
    assert got == {
        "process_cpu_seconds_total": 1.5,
        "prometheus_tsdb_head_samples_appended_total": 12.0,
    }
