"""``gpumon-deploy capacity``: the series, samples and sizes it predicts, and from what."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer.cli import cli
from deployer.errors import InputError
from deployer.monitoring import capacity
from tests.reality import capture, capture_text

MIG_LAYOUT = {0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}

INVENTORY = """\
all:
  hosts:
    gpu01: {gpu_model: H100, gpu_count: 8, cluster: c1, scrape_tier: training}
    gpu02: {gpu_model: L40S, gpu_count: 4, cluster: c1}
    gpu03: {gpu_model: H100, gpu_count: 2, cluster: c2, gpu_mig: {0: [3g.40gb, 2g.20gb]}}
    prom01: {}
    prom02: {}
  children:
    gpu: {hosts: {gpu01: {}, gpu02: {}, gpu03: {}}}
    prometheus: {hosts: {prom01: {}, prom02: {}}}
"""


def capacity_json(tmp_path: Path, text: str = INVENTORY, *extra: str) -> dict:
    (tmp_path / "inv.yml").write_text(text)
    result = CliRunner().invoke(
        cli, ["capacity", "-i", str(tmp_path / "inv.yml"), "--output", "json", *extra]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def scraped_metric_names(text: str) -> set[str]:
    return {line.split("{")[0].split()[0] for line in text.splitlines() if line and line[0] != "#"}


def test_label_lines_and_comments_of_the_csv_are_no_series():
    text = "# c\nDCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DRIVER_VERSION, label, d\n\n"
    assert capacity.csv_series_fields(text) == ["DCGM_FI_DEV_GPU_TEMP"]


def test_the_real_l40s_scrape_has_as_many_series_as_predicted_from_its_csv():
    # The UpCloud L40S scrape was taken with upstream's default CSV: no XID yet, no NVLink.
    csv = capture("dcgm-exporter/4.5.3-4.8.2__default-counters.csv").read_text()
    scrape = capture_text("dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics")
    predicted = capacity.dcgm_series(csv, 1, [], capacity.traits_of("L40S"))
    assert predicted == len(scraped_metric_names(scrape))


def test_a_mig_gpu_reports_each_field_once_per_instance_without_utilisation():
    csv = "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_GPU_UTIL, gauge, u\n"
    traits = capacity.traits_of("H100")
    assert capacity.dcgm_series(csv, 2, [4], traits) == 2 + 4 * 1


def test_an_ampere_gpu_has_no_retired_pages_and_a_volta_gpu_no_row_remapping():
    csv = "DCGM_FI_DEV_RETIRED_SBE, counter, r\nDCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, f\n"
    assert capacity.dcgm_series(csv, 1, [], capacity.traits_of("A100")) == 1
    assert capacity.dcgm_series(csv, 1, [], capacity.traits_of("V100")) == 1


def test_the_last_xid_field_is_blank_until_the_first_xid():
    csv = "DCGM_FI_DEV_XID_ERRORS, gauge, x\n"
    assert capacity.dcgm_series(csv, 8, [], capacity.traits_of("H100")) == 0


def test_a_list_gpu_mig_lays_out_every_gpu_alike():
    assert capacity.mig_instances(["1g.10gb"] * 7, 2, "h") == [7, 7]
    assert capacity.mig_instances(MIG_LAYOUT, 2, "h") == [4]


def test_a_gpu_mig_that_is_no_layout_is_refused_naming_the_key():
    with pytest.raises(InputError) as exc:
        capacity.mig_instances("3g.40gb", 1, "gpu01")
    assert exc.value.key == "gpu_mig"


def test_a_bad_retention_is_refused_naming_the_variable():
    with pytest.raises(InputError) as exc:
        capacity.duration_s("15 days", "prometheus_retention_time")
    assert exc.value.key == "prometheus_retention_time"


def test_samples_per_second_follow_each_targets_scrape_interval():
    loads = [
        capacity.TargetLoad("dcgm", "a", 50, 5.0),
        capacity.TargetLoad("node", "a", 300, 30.0),
    ]
    got = capacity.compute(loads, 0, 0, 0, capacity.Settings())
    assert got.per_replica.samples_per_s == pytest.approx(50 / 5 + 300 / 30)


def test_disk_is_samples_times_bytes_per_sample_times_retention():
    s = capacity.Settings(retention_s=10 * 86400, bytes_per_sample=2.0)
    got = capacity.compute([capacity.TargetLoad("node", "a", 150, 15.0)], 0, 0, 0, s)
    assert got.per_replica.disk_per_day_bytes == pytest.approx(10 * 86400 * 2.0)
    assert got.per_replica.disk_retention_bytes == pytest.approx(10 * 86400 * 2.0 * 10)
    assert got.per_replica.head_memory_bytes == 150 * capacity.BYTES_PER_SERIES


def test_one_pair_is_recommended_while_the_series_fit_the_target():
    got = capacity.compute(
        [capacity.TargetLoad("node", "a", 1000, 15.0)], 0, 0, 0, capacity.Settings()
    )
    assert got.recommended_shards == 1


def test_shards_are_recommended_by_series_when_they_bind_and_say_why():
    loads = [capacity.TargetLoad("dcgm", str(i), 300, 60.0) for i in range(20_000)]
    got = capacity.compute(loads, 0, 0, 0, capacity.Settings(series_per_replica=1_000_000))
    assert got.recommended_shards == 6
    assert "active series" in got.why and "1,000,000" in got.why


def test_shards_are_recommended_by_samples_when_they_bind():
    loads = [capacity.TargetLoad("dcgm", str(i), 100, 1.0) for i in range(10_000)]
    got = capacity.compute(loads, 0, 0, 0, capacity.Settings(samples_per_replica=100_000))
    assert got.recommended_shards == 10
    assert "samples/s" in got.why


def test_capacity_counts_the_series_of_the_csv_the_role_renders(tmp_path: Path):
    got = capacity_json(tmp_path)
    # H100 x8 + L40S x4 + H100 x2 (one in MIG with two instances): every host's CSV counted
    assert got["by_job"]["dcgm"]["targets"] == 3
    assert got["gpus"] == 14
    assert set(got["by_job"]) == {"dcgm", "node", "prometheus"}


def test_a_training_tier_host_is_counted_at_its_tier_interval(tmp_path: Path):
    slow = capacity_json(tmp_path, INVENTORY.replace("scrape_tier: training", "scrape_tier: none"))
    fast = capacity_json(tmp_path)
    assert fast["by_job"]["dcgm"]["samples_per_s"] > slow["by_job"]["dcgm"]["samples_per_s"]


def test_a_site_sets_its_own_node_exporter_series(tmp_path: Path):
    got = capacity_json(tmp_path, INVENTORY, "-e", "capacity_node_series=2000")
    assert got["by_job"]["node"]["series"] == 5 * (2000 + capacity.SCRAPE_SERIES_PER_TARGET)


def test_the_human_table_names_the_recommended_shards(tmp_path: Path):
    (tmp_path / "inv.yml").write_text(INVENTORY)
    result = CliRunner().invoke(cli, ["capacity", "-i", str(tmp_path / "inv.yml")])
    assert result.exit_code == 0, result.output
    assert "recommended shards" in result.output


def test_a_bad_capacity_variable_exits_2_naming_it(tmp_path: Path):
    (tmp_path / "inv.yml").write_text(INVENTORY)
    result = CliRunner().invoke(
        cli, ["capacity", "-i", str(tmp_path / "inv.yml"), "-e", "prometheus_retention_time=soon"]
    )
    assert result.exit_code == 2
    assert "prometheus_retention_time" in result.output


# INVENTORY with two shards of two replicas each
SHARDED = INVENTORY.replace(
    "    prom01: {}\n    prom02: {}\n",
    "    prom01: {prometheus_shard: a}\n    prom02: {prometheus_shard: a}\n"
    "    prom03: {prometheus_shard: b}\n    prom04: {prometheus_shard: b}\n",
).replace("prometheus: {hosts: {prom01: {}, prom02: {}}}",
          "prometheus: {hosts: {prom01: {}, prom02: {}, prom03: {}, prom04: {}}}")  # fmt: skip


def test_a_sharded_tier_is_sized_per_shard_from_the_real_assignment(tmp_path: Path):
    got = capacity_json(tmp_path, SHARDED)
    assert set(got["per_shard"]) == {"a", "b"}
    whole = got["per_replica"]["series"]
    each = [f["series"] for f in got["per_shard"].values()]
    # each shard holds its hosts' series and the stack's own (scraped by every shard)
    assert all(0 < n < whole for n in each)
    assert sum(each) >= whole


def test_another_tiers_shard_record_is_a_warning_and_the_tier_is_sized_without_it(
    tmp_path: Path,
):
    # capacity only reads: the record up refuses is said, the layout sized as it will run
    record = tmp_path / "record.json"
    sharded = SHARDED.replace("all:\n", f"all:\n  vars: {{prometheus_shard_record: {record}}}\n")
    before = capacity_json(tmp_path, sharded)
    theirs = {"format": 1, "shards": [""], "by": "host", "replicas": ["prom11", "prom12"]}
    record.write_text(json.dumps(theirs))
    got = capacity_json(tmp_path, sharded)
    [said] = [w for w in got["warnings"] if "shard layout record" in w]
    assert "another tier's (one pair of prom11, prom12)" in said and said.endswith(
        "(up refuses it; sized as if there were none)"
    )
    assert got["per_shard"] == before["per_shard"]
    assert json.loads(record.read_text()) == theirs


def test_a_sharded_tier_counts_every_gpu_host_whichever_replica_is_read(tmp_path: Path):
    # the command reads the first replica's variables; its own shard is not the whole tier
    four = INVENTORY.replace(
        "    prom01: {}\n    prom02: {}\n",
        "    prom01: {}\n    prom02: {}\n    prom03: {}\n    prom04: {}\n",
    ).replace("prometheus: {hosts: {prom01: {}, prom02: {}}}",
              "prometheus: {hosts: {prom01: {}, prom02: {}, prom03: {}, prom04: {}}}")  # fmt: skip
    sharded = (
        four.replace("prom01: {}\n", "prom01: {prometheus_shard: a}\n")
        .replace("prom02: {}\n", "prom02: {prometheus_shard: a}\n")
        .replace("prom03: {}\n", "prom03: {prometheus_shard: b}\n")
        .replace("prom04: {}\n", "prom04: {prometheus_shard: b}\n")
    )
    one_pair = capacity_json(tmp_path, four)
    got = capacity_json(tmp_path, sharded)
    assert got["per_replica"]["series"] == one_pair["per_replica"]["series"]
    assert got["gpus"] == one_pair["gpus"] == 14


def test_sizing_a_sharded_tier_renders_no_replica_variable_it_does_not_read(
    tmp_path: Path, monkeypatch
):
    # Each shard's replica is read through its variables, not a copy of them: a copy rendered
    # every one, prometheus_cluster among them, which reads the cluster of every scraped host
    # (a tenth of sizing 100,000 hosts, for a label the capacity has no use for)
    from deployer.monitoring import file_sd

    def not_read(*_args):
        raise AssertionError("prometheus_cluster rendered")

    monkeypatch.setattr(file_sd, "common_cluster", not_read)
    got = capacity_json(tmp_path, SHARDED)
    assert set(got["per_shard"]) == {"a", "b"}
