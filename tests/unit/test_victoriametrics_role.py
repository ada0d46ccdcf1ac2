"""The long-term store as the engine plans it: the victoriametrics role (unit, credentials,
backups) and the replicas' remote_write section, taken from the engine's own plan of the product's
site over a test inventory, so the tests see exactly what ``up`` would write. promtool checks the
rendered prometheus.yml (skipped without it, except in CI)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.monitoring import remote_write
from deployer.plan import PlannedTask
from deployer.roles import load_site
from deployer.session import DEFAULT_SITE, DeploySession, RunOptions
from tests.unit.test_monitoring_config import exec_flags, tool

ROOT = Path(__file__).resolve().parents[2]

INVENTORY = """\
all:
  vars:
    release_mirror_url: http://mirror.invalid/releases
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8, cluster: c1,
            scrape_tier: training}
    gpu02: {ansible_host: 192.0.2.12, gpu_model: A100, gpu_count: 4, cluster: c2,
            scrape_tier: inference}
    prom01: {ansible_host: 192.0.2.21}
    prom02: {ansible_host: 192.0.2.22}
    mon01: {ansible_host: 192.0.2.23}
    mon02: {ansible_host: 192.0.2.24}
  children:
    gpu:
      hosts: {gpu01: {}, gpu02: {}}
    monitoring:
      vars: {cluster: c1}
      children:
        prometheus:
          hosts: {prom01: {}, prom02: {}}
        alertmanager:
          hosts: {prom01: {}, prom02: {}, mon01: {}}
        thanos_query:
          hosts: {mon01: {}}
        metrics_store:
          hosts: {mon01: {}, mon02: {}}
"""

# The same tier as two shards of one replica each.
SHARDED = INVENTORY.replace(
    "prom01: {ansible_host: 192.0.2.21}", "prom01: {ansible_host: 192.0.2.21, prometheus_shard: a}"
).replace(
    "prom02: {ansible_host: 192.0.2.22}", "prom02: {ansible_host: 192.0.2.22, prometheus_shard: b}"
)
SECRETS = {
    "metrics_store_username": "writer",
    "metrics_store_password": 'Pa55"w\\rd-secret',
    "victoriametrics_backup_s3_bucket": "dr-bucket",
    "victoriametrics_backup_s3_endpoint": "http://192.0.2.99:9000",
    "victoriametrics_backup_s3_access_key_id": "AKIAEXAMPLEKEYID",
    "victoriametrics_backup_s3_secret_access_key": "s3-secret-access-key-value",
}


def plan(
    tmp_path: Path, *extra: str, inventory: str = INVENTORY
) -> dict[str, dict[str, list[PlannedTask]]]:
    inv = tmp_path / "inventory.yml"
    inv.write_text(inventory)
    session = DeploySession.load(RunOptions(inventory=inv, extra_vars=list(extra)))
    out: dict[str, dict[str, list[PlannedTask]]] = {}
    for hp in session.plans:
        for play in hp.plays:
            for t in [*play.tasks, *play.handlers.values()]:
                out.setdefault(hp.host, {}).setdefault(t.role, []).append(t)
    return out


def task(planned: Any, host: str, role: str, name: str) -> PlannedTask:
    found = [t for t in planned[host][role] if t.name.startswith(name)]
    assert found, f"{host}/{role}: no task {name!r}: {[t.name for t in planned[host][role]]}"
    return found[0]


def names(planned: Any, host: str, role: str = "victoriametrics") -> list[str]:
    return [t.name for t in planned[host][role]]


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return plan(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return plan(tmp_path_factory.mktemp("secured"), json.dumps(SECRETS))


def prometheus_yml(planned: Any, host: str = "prom01") -> dict[str, Any]:
    return yaml.safe_load(task(planned, host, "prometheus", "prometheus.yml").args["content"])


# ---------------------------------------------------------------- the site


def test_store_play_runs_after_alertmanager_and_before_the_replicas():
    plays = load_site(DEFAULT_SITE)
    order = [p.roles[0] for p in plays]
    store = next(p for p in plays if "victoriametrics" in p.roles)
    assert store.hosts == "metrics_store"
    assert order.index("alertmanager") < order.index("victoriametrics") < order.index("prometheus")


def test_store_hosts_get_node_exporter(planned):
    assert "node_exporter" in planned["mon02"]


def test_shared_store_variables_are_the_same_in_both_roles():
    def block(role: str) -> dict[str, Any]:
        d = yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text())
        return {k: v for k, v in d.items() if k.startswith("metrics_store_")}

    assert block("prometheus") == block("victoriametrics")
    assert set(block("prometheus")) == {
        "metrics_store_group",
        "metrics_store_port",
        "metrics_store_scheme",
        "metrics_store_username",
        "metrics_store_password",
    }


# ---------------------------------------------------------------- the server


def test_package_install_runs_the_debian_binary_under_its_own_user(planned):
    unit = task(planned, "mon01", "victoriametrics", "victoria-metrics hardened unit").args
    flags = exec_flags(unit["content"])
    assert flags[0] == "/usr/bin/victoria-metrics"
    assert "User=_victoria-metrics" in unit["content"]
    assert "-storageDataPath=/var/lib/victoria-metrics" in flags
    assert "-retentionPeriod=1y" in flags
    assert "-httpListenAddr=0.0.0.0:8428" in flags
    assert "victoria-metrics OS package" in names(planned, "mon01")
    assert not [n for n in names(planned, "mon01") if "release archive" in n]


def test_unit_is_hardened(planned):
    content = task(planned, "mon01", "victoriametrics", "victoria-metrics hardened unit").args[
        "content"
    ]
    for line in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/victoria-metrics",
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
        "PrivateDevices=yes",
    ):
        assert line in content.splitlines(), line


def test_unit_file_and_credentials_are_written_before_the_package_starts_it(planned):
    order = names(planned, "mon01")
    pkg = order.index("victoria-metrics OS package")
    assert order.index("victoria-metrics hardened unit, enabled") < pkg
    assert (
        order.index("the store's credentials for the server (secret, 0600 root; read by systemd)")
        < pkg
    )


def test_dedup_interval_is_the_replicas_scrape_interval(tmp_path):
    flags = exec_flags(
        task(plan(tmp_path), "mon01", "victoriametrics", "victoria-metrics hardened unit").args[
            "content"
        ]
    )
    assert "-dedup.minScrapeInterval=15s" in flags
    other = plan(tmp_path, "prometheus_scrape_interval=30s")
    flags = exec_flags(
        task(other, "mon01", "victoriametrics", "victoria-metrics hardened unit").args["content"]
    )
    assert "-dedup.minScrapeInterval=30s" in flags


def test_archive_install_verifies_both_upstream_archives_against_their_checksums(tmp_path):
    planned = plan(tmp_path, "victoriametrics_install=archive")
    server = task(
        planned, "mon01", "victoriametrics", "victoria-metrics release archive (sha256 from"
    ).args
    base = (
        "http://mirror.invalid/releases/VictoriaMetrics/VictoriaMetrics/releases/download/v1.79.5"
    )
    assert server["url"] == f"{base}/victoria-metrics-linux-amd64-v1.79.5.tar.gz"
    assert server["checksum_url"] == f"{base}/victoria-metrics-linux-amd64-v1.79.5_checksums.txt"
    utils = task(planned, "mon01", "victoriametrics", "vmutils release archive (sha256 from").args
    assert utils["url"] == f"{base}/vmutils-linux-amd64-v1.79.5.tar.gz"
    unit = task(planned, "mon01", "victoriametrics", "victoria-metrics hardened unit").args
    assert exec_flags(unit["content"])[0] == "/usr/local/bin/victoria-metrics"
    assert "User=_victoria-metrics" in unit["content"]
    assert "victoriametrics system user" in names(planned, "mon01")


def test_pinned_archive_sha256_is_used_instead_of_the_checksum_list(tmp_path):
    digest = "a" * 64
    planned = plan(tmp_path, "victoriametrics_install=archive", f"victoriametrics_sha256={digest}")
    server = task(
        planned, "mon01", "victoriametrics", "victoria-metrics release archive (pinned"
    ).args
    assert server["sha256"] == digest


def test_without_credentials_the_env_file_holds_none(planned):
    env = task(planned, "mon01", "victoriametrics", "the store's credentials for the server").args
    assert "httpAuth" not in env["content"]
    assert env["mode"] == "600" and env["owner"] == "root"


def test_credentials_reach_the_server_through_a_0600_environment_file(secured):
    env = task(secured, "mon01", "victoriametrics", "the store's credentials for the server")
    assert env.args["mode"] == "600"
    assert "content" in env.secret_args
    assert 'httpAuth_password="Pa55\\"w\\\\rd-secret"' in env.args["content"]
    unit = task(secured, "mon01", "victoriametrics", "victoria-metrics hardened unit").args
    assert "-envflag.enable" in exec_flags(unit["content"])
    assert "secret" not in unit["content"]


# ---------------------------------------------------------------- backups


def test_no_backup_without_a_bucket(planned):
    got = names(planned, "mon01")
    assert "backup timer, enabled and running" not in got
    assert "no backup timer without a bucket" in got


def test_backup_runs_incremental_vmbackup_to_the_hosts_own_path(secured):
    script = task(secured, "mon01", "victoriametrics", "backup script").args["content"]
    assert "-dst=s3://dr-bucket/gpumon/mon01/latest" in script
    assert "-customS3Endpoint=http://192.0.2.99:9000" in script
    assert "-credsFilePath=/etc/victoria-metrics/backup-s3-credentials" in script
    assert "-httpListenAddr=127.0.0.1:8420" in script
    assert "-K /etc/victoria-metrics/backup-store-auth" in script
    other = task(secured, "mon02", "victoriametrics", "backup script").args["content"]
    assert "-dst=s3://dr-bucket/gpumon/mon02/latest" in other


def test_backup_scripts_and_units_carry_no_secret(secured):
    for name in ("backup script", "backup service", "backup timer"):
        text = task(secured, "mon01", "victoriametrics", name).args["content"]
        for value in ("Pa55", "s3-secret-access-key-value", "AKIAEXAMPLEKEYID"):
            assert value not in text, (name, value)


def test_s3_keys_and_store_credentials_for_the_backup_are_0600_for_the_store_user(secured):
    for name in ("S3 credentials for vmbackup", "the store's credentials for the backup"):
        t = task(secured, "mon01", "victoriametrics", name)
        assert t.args["mode"] == "600" and t.args["owner"] == "_victoria-metrics", name
        assert "content" in t.secret_args
    keys = task(secured, "mon01", "victoriametrics", "S3 credentials for vmbackup").args["content"]
    assert "aws_secret_access_key = s3-secret-access-key-value" in keys
    curl = task(secured, "mon01", "victoriametrics", "the store's credentials for the backup")
    assert 'user = "writer:Pa55\\"w\\\\rd-secret"' in curl.args["content"]


def test_a_successful_backup_records_its_time_for_node_exporter(secured):
    service = task(secured, "mon01", "victoriametrics", "backup service").args["content"]
    assert "ExecStartPost=+/usr/local/sbin/gpumon-vmbackup-done" in service
    done = task(secured, "mon01", "victoriametrics", "backup success recorder").args["content"]
    assert "dir=/var/lib/node_exporter/textfile_collector" in done
    assert "gpumon_vmbackup_last_success_timestamp_seconds" in done


def test_backup_timer_is_monotonic_so_a_new_store_waits_an_interval(secured):
    timer = task(secured, "mon01", "victoriametrics", "backup timer").args["content"]
    assert "OnActiveSec=1h" in timer and "OnUnitInactiveSec=1h" in timer
    assert "OnCalendar" not in timer


# ---------------------------------------------------------------- remote_write


def test_each_replica_writes_to_every_store_host(planned):
    for replica in ("prom01", "prom02"):
        rw = prometheus_yml(planned, replica)["remote_write"]
        assert [e["url"] for e in rw] == [
            "http://192.0.2.23:8428/api/v1/write",
            "http://192.0.2.24:8428/api/v1/write",
        ]
        assert [e["name"] for e in rw] == ["store-mon01", "store-mon02"]


def test_remote_write_drops_only_the_replica_label(tmp_path):
    rw = prometheus_yml(plan(tmp_path))["remote_write"][0]
    assert rw["write_relabel_configs"] == [{"action": "labeldrop", "regex": "replica"}]
    renamed = prometheus_yml(plan(tmp_path, "prometheus_replica_label=prom_replica"))
    assert renamed["remote_write"][0]["write_relabel_configs"][0]["regex"] == "prom_replica"
    # cluster stays an external label, so every sample keeps it
    assert "cluster" in renamed["global"]["external_labels"]


def relabelled(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str]:
    """Prometheus' ``labeldrop`` and ``replace`` as model/relabel/relabel.go applies them: the
    source labels joined by the separator, the regex anchored, an empty replacement deleting
    the target label."""
    import re

    out = dict(labels)
    for c in configs:
        if c["action"] == "labeldrop":
            out = {k: v for k, v in out.items() if not re.fullmatch(c["regex"], k)}
            continue
        assert c["action"] == "replace", c
        value = c.get("separator", ";").join(out.get(n, "") for n in c["source_labels"])
        if re.fullmatch(c["regex"], value) and c["replacement"] == "":
            out.pop(c["target_label"], None)
    return out


def test_a_sharded_replica_writes_a_hosts_own_series_without_its_shard_label(tmp_path):
    # a host that moves to another shard stays one series in the store, written by both owners
    planned = plan(tmp_path, inventory=SHARDED)
    configs = prometheus_yml(planned, "prom01")["remote_write"][0]["write_relabel_configs"]
    assert configs == prometheus_yml(planned, "prom02")["remote_write"][0]["write_relabel_configs"]
    external = {"cluster": "c1", "replica": "prom01", "shard": "a"}
    gpu_series = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "job": "dcgm", "node": "gpu01", **external}
    assert relabelled(gpu_series, configs) == {
        "__name__": "DCGM_FI_DEV_GPU_TEMP",
        "job": "dcgm",
        "node": "gpu01",
        "cluster": "c1",
    }
    node_series = {"__name__": "node_load1", "job": "node", "node": "gpu01", **external}
    assert "shard" not in relabelled(node_series, configs)
    per_gpu_record = {"__name__": "gpu:gpu_power_usage_watts:max", "node": "gpu01", **external}
    assert "shard" not in relabelled(per_gpu_record, configs)
    # a shard's part of a sum, and what every shard scrapes of the stack, keep it
    shard_part = {"__name__": "cluster:gpu_power_usage_watts:sum", "job": "dcgm", **external}
    assert relabelled(shard_part, configs)["shard"] == "a"
    stack = {"__name__": "up", "job": "alertmanager", "node": "mon01", **external}
    assert relabelled(stack, configs)["shard"] == "a"
    # an unsharded tier has no shard label to drop: the replica label alone (the test above)


def test_remote_write_reads_its_password_from_a_0600_file(secured):
    rw = prometheus_yml(secured)["remote_write"][0]
    assert rw["basic_auth"] == {
        "username": "writer",
        "password_file": "/etc/prometheus/remote-write-password",
    }
    text = task(secured, "prom01", "prometheus", "prometheus.yml").args["content"]
    assert "Pa55" not in text
    pw = task(secured, "prom01", "prometheus", "remote-write password")
    assert pw.args["mode"] == "600" and pw.args["owner"] == "prometheus"
    assert pw.args["content"] == SECRETS["metrics_store_password"]
    assert "content" in pw.secret_args


def test_without_credentials_the_password_file_is_emptied_not_deleted(planned):
    # the running config may name it until the reload: a missing file would stall that reload
    pw = task(planned, "prom01", "prometheus", "remote-write password")
    assert pw.args["content"] == "" and pw.args["mode"] == "600"
    assert "basic_auth" not in prometheus_yml(planned)["remote_write"][0]


def test_no_remote_write_without_a_store(tmp_path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        INVENTORY.replace("        metrics_store:\n          hosts: {mon01: {}, mon02: {}}\n", "")
    )
    session = DeploySession.load(RunOptions(inventory=inv))
    plans = {p.host: p for p in session.plans}
    tasks = [t for hp in plans["prom01"].plays for t in hp.tasks]
    config = yaml.safe_load(
        next(t for t in tasks if t.name.startswith("prometheus.yml")).args["content"]
    )
    assert "remote_write" not in config
    assert "victoriametrics" not in [j["job_name"] for j in config["scrape_configs"]]


def test_replicas_scrape_the_store_as_a_file_sd_job(planned, secured):
    jobs = {j["job_name"]: j for j in prometheus_yml(planned)["scrape_configs"]}
    assert jobs["victoriametrics"]["file_sd_configs"][0]["files"] == [
        "/etc/prometheus/file_sd/victoriametrics.json"
    ]
    targets = task(planned, "prom01", "prometheus", "file_sd targets of job victoriametrics")
    assert [g["targets"] for g in json.loads(targets.args["content"])] == [
        ["192.0.2.23:8428"],
        ["192.0.2.24:8428"],
    ]
    secured_job = {j["job_name"]: j for j in prometheus_yml(secured)["scrape_configs"]}
    assert secured_job["victoriametrics"]["basic_auth"]["username"] == "writer"


@pytest.mark.parametrize("inventory", ["one pair", "two shards"])
def test_rendered_config_with_remote_write_passes_promtool(tmp_path, secured, inventory):
    promtool = tool("promtool")
    if inventory == "two shards":
        secured = plan(tmp_path, json.dumps(SECRETS), inventory=SHARDED)
    text = task(secured, "prom01", "prometheus", "prometheus.yml").args["content"]
    config = yaml.safe_load(text)
    # promtool resolves the files the config names: point them into the test's directory.
    (tmp_path / "pw").write_text("x")
    for entry in config["remote_write"]:
        entry["basic_auth"]["password_file"] = str(tmp_path / "pw")
    for job in config["scrape_configs"]:
        if "basic_auth" in job:
            job["basic_auth"]["password_file"] = str(tmp_path / "pw")
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(tmp_path / Path(f).name) for f in sd["files"]]
    config["rule_files"] = []
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- queue sizing


def sizing_vars(**over: Any) -> dict[str, Any]:
    d = yaml.safe_load((ROOT / "roles/prometheus/defaults/main.yml").read_text())
    v = {k: val for k, val in d.items() if k.startswith(("prometheus_remote_write_", "metrics_"))}
    v.update(prometheus_scrape_interval="15s", **over)
    return v


def test_queue_is_sized_from_the_ingested_rate():
    small = remote_write.queue_config(sizing_vars(), 2_000)
    assert small["min_shards"] == 1 and small["max_shards"] == 4  # the floor
    assert small["max_samples_per_send"] == 10_000 and small["capacity"] == 30_000
    # 400k samples/s (1,000 8-GPU hosts at 5 s): one shard moves 10,000 / 0.5 s = 20k/s
    big = remote_write.queue_config(sizing_vars(), 400_000)
    assert big["min_shards"] == 20
    assert big["max_shards"] == 180  # 400k x (1 + 2h/15m) / 20k


def test_max_shards_never_exceeds_prometheus_default_ceiling():
    assert remote_write.queue_config(sizing_vars(), 10_000_000)["max_shards"] == 200


def test_rate_counts_gpus_and_tiers(tmp_path):
    planned = plan(tmp_path)
    rw = prometheus_yml(planned)["remote_write"][0]["queue_config"]
    assert rw["min_shards"] == 1
    inv = tmp_path / "inventory.yml"
    session = DeploySession.load(RunOptions(inventory=inv))
    planner = session.planner
    assert planner is not None
    play = next(p for p in session.plays if "prometheus" in p.roles)
    rate = remote_write.samples_per_second(planner.host_vars("prom01", play))
    # dcgm: 8 GPUs x 60 / 5 s + 4 x 60 / 30 s; node: 1500 / 5 s + 1500 / 30 s + 4 x 1500 / 15 s;
    # prometheus 2 x 1500 / 15; alertmanager 3 x 300 / 15; victoriametrics 2 x 1500 / 15
    scraped = 96 + 8 + 300 + 50 + 400 + 200 + 60 + 200
    assert rate == pytest.approx(scraped * 1.1)


@pytest.mark.parametrize(
    ("text", "want"), [("15s", 15), ("1m30s", 90), ("2h", 7200), ("500ms", 0.5), ("1d", 86400)]
)
def test_durations_read_as_prometheus_reads_them(text, want):
    assert remote_write.seconds(text) == want


def test_a_duration_prometheus_would_refuse_is_refused():
    with pytest.raises(ValueError):
        remote_write.seconds("15 s")


# ---------------------------------------------------------------- secrets in the inventory view


def test_inventory_view_masks_every_store_and_s3_secret(tmp_path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    session = DeploySession.load(
        RunOptions(inventory=inv, extra_vars=[json.dumps(SECRETS)]), plan=False
    )
    text = json.dumps(session.inventory_view("mon01"), default=str)
    for key in (
        "metrics_store_password",
        "victoriametrics_backup_s3_secret_access_key",
        "victoriametrics_backup_s3_access_key_id",
    ):
        assert SECRETS[key] not in text, key
