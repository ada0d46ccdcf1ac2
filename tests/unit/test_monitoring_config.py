"""The monitoring roles as the engine plans them: rendered prometheus.yml, alertmanager.yml, units,
Thanos flags and object-storage configs, and the tasks and handlers that apply them.

Every file is taken from the engine's own plan (DeploySession over a test inventory and a site
with the monitoring plays), so the tests see exactly what ``up`` would write. promtool and amtool
(Debian's prometheus and prometheus-alertmanager packages) check the rendered files; without them
those tests skip, unless CI is set, where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.plan import PlannedTask
from deployer.roles import load_site
from deployer.session import DEFAULT_SITE, DeploySession, RunOptions

INVENTORY = """\
all:
  vars:
    release_mirror_url: http://mirror.invalid/releases
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8, cluster: c1, rack: r1,
            slurm_partition: train, scrape_tier: training}
    gpu02: {ansible_host: 192.0.2.12, gpu_model: A100, gpu_count: 4, cluster: c1, rack: r2,
            slurm_partition: infer, scrape_tier: inference}
    prom01: {ansible_host: 192.0.2.21}
    prom02: {ansible_host: 192.0.2.22}
    mon01: {ansible_host: 192.0.2.23}
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
"""

MONITORING_PLAYS = """\
- name: Alertmanager cluster
  hosts: alertmanager
  roles: [alertmanager]
- name: Prometheus HA pair
  hosts: prometheus
  serial: 1
  roles: [prometheus, thanos_sidecar]
- name: Thanos Query
  hosts: thanos_query
  roles: [thanos_query]
"""


def plan(tmp_path: Path, *extra_vars: str) -> dict[str, dict[str, list[PlannedTask]]]:
    """host -> role -> planned tasks (handlers included), as ``up`` would plan them."""
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    site = tmp_path / "site.yml"
    site.write_text(MONITORING_PLAYS)
    session = DeploySession.load(RunOptions(inventory=inv, site=site, extra_vars=list(extra_vars)))
    out: dict[str, dict[str, list[PlannedTask]]] = {}
    for hp in session.plans:
        for play in hp.plays:
            for t in [*play.tasks, *play.handlers.values()]:
                out.setdefault(hp.host, {}).setdefault(t.role, []).append(t)
    return out


def task(
    planned: dict[str, dict[str, list[PlannedTask]]], host: str, role: str, name: str
) -> PlannedTask:
    found = [t for t in planned[host][role] if t.name.startswith(name)]
    assert found, (
        f"{host}/{role}: no task starting {name!r}: {[t.name for t in planned[host][role]]}"
    )
    return found[0]


def content(planned: Any, host: str, role: str, name: str) -> str:
    return task(planned, host, role, name).args["content"]


def prometheus_yml(planned: Any, host: str = "prom01") -> dict[str, Any]:
    return yaml.safe_load(content(planned, host, "prometheus", "prometheus.yml"))


def exec_flags(unit: str) -> list[str]:
    """The ExecStart words of a unit file (continuation lines joined)."""
    text = unit.replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI")
        pytest.skip(f"{name} not installed")
    return found


@pytest.fixture
def planned(tmp_path: Path) -> dict[str, dict[str, list[PlannedTask]]]:
    return plan(tmp_path)


# ---------------------------------------------------------------- prometheus.yml


def test_external_labels_share_the_cluster_and_differ_by_replica(planned):
    a = prometheus_yml(planned, "prom01")["global"]["external_labels"]
    b = prometheus_yml(planned, "prom02")["global"]["external_labels"]
    assert a == {"cluster": "c1", "replica": "prom01"}
    assert b == {"cluster": "c1", "replica": "prom02"}


def test_external_label_names_are_configurable(tmp_path):
    planned = plan(
        tmp_path, "prometheus_replica_label=prometheus_replica", "prometheus_cluster_label=site"
    )
    config = prometheus_yml(planned)
    assert config["global"]["external_labels"] == {"site": "c1", "prometheus_replica": "prom01"}
    assert config["alerting"]["alert_relabel_configs"] == [
        {"action": "labeldrop", "regex": "prometheus_replica"}
    ]


def test_alerts_drop_the_replica_label_so_the_pair_deduplicates(planned):
    relabel = prometheus_yml(planned)["alerting"]["alert_relabel_configs"]
    assert relabel == [{"action": "labeldrop", "regex": "replica"}]


def test_every_alertmanager_is_listed_directly(planned):
    ams = prometheus_yml(planned)["alerting"]["alertmanagers"]
    assert len(ams) == 1 and ams[0]["api_version"] == "v2"
    assert ams[0]["static_configs"] == [
        {"targets": ["192.0.2.21:9093", "192.0.2.22:9093", "192.0.2.23:9093"]}
    ]


def test_scrape_jobs_read_one_targets_file_each(planned):
    jobs = {j["job_name"]: j for j in prometheus_yml(planned)["scrape_configs"]}
    assert list(jobs) == ["dcgm", "node", "prometheus", "alertmanager"]
    for name, job in jobs.items():
        assert job["file_sd_configs"] == [
            {"files": [f"/etc/prometheus/file_sd/{name}.json"], "refresh_interval": "1m"}
        ]


def test_every_job_has_sample_label_and_target_limits(planned):
    for job in prometheus_yml(planned)["scrape_configs"]:
        assert job["sample_limit"] > 0
        assert job["label_limit"] > 0
        assert job["label_value_length_limit"] > 0
        assert job["target_limit"] > 0
    dcgm = prometheus_yml(planned)["scrape_configs"][0]
    assert dcgm["sample_limit"] == 5000


def test_limits_and_honor_timestamps_are_variables(tmp_path):
    planned = plan(
        tmp_path,
        "prometheus_honor_timestamps=false",
        '{"prometheus_scrape_limits": {"dcgm": {"sample_limit": 123}}}',
    )
    jobs = {j["job_name"]: j for j in prometheus_yml(planned)["scrape_configs"]}
    assert all(j["honor_timestamps"] is False for j in jobs.values())
    assert jobs["dcgm"]["sample_limit"] == 123
    assert "sample_limit" not in jobs["node"]


def test_rule_files_are_the_rule_pack_directory(planned):
    assert prometheus_yml(planned)["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    names = [
        t.args["dest"] for t in planned["prom01"]["prometheus"] if t.name.startswith("rule file")
    ]
    assert names == [
        "/etc/prometheus/rules/gpu-alerts.yml",
        "/etc/prometheus/rules/gpu-recording.yml",
        "/etc/prometheus/rules/meta-alerts.yml",
        "/etc/prometheus/rules/shard-recording.yml",  # the federation tier's inputs
    ]


def test_config_and_rules_are_checked_by_promtool_before_they_replace_the_live_files(planned):
    assert (
        task(planned, "prom01", "prometheus", "prometheus.yml").args["validate"]
        == "/usr/local/bin/promtool check config %s"
    )
    for t in planned["prom01"]["prometheus"]:
        if t.name.startswith("rule file"):
            assert t.args["validate"] == "/usr/local/bin/promtool check rules %s"


def test_rendered_config_and_rules_pass_promtool(planned, tmp_path):
    promtool = tool("promtool")
    rules = tmp_path / "rules"
    rules.mkdir()
    for t in planned["prom01"]["prometheus"]:
        if t.name.startswith("rule file"):
            (rules / Path(t.args["dest"]).name).write_text(t.args["content"])
    config = content(planned, "prom01", "prometheus", "prometheus.yml").replace(
        "/etc/prometheus/rules/", f"{rules}/"
    )
    (tmp_path / "prometheus.yml").write_text(config)
    proc = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 rules found" not in proc.stdout  # the pack has far more than three rules
    assert "SUCCESS" in proc.stdout


def test_promtool_refuses_a_scrape_timeout_longer_than_the_interval(tmp_path):
    promtool = tool("promtool")
    planned = plan(tmp_path, "prometheus_scrape_interval=5s", "prometheus_scrape_timeout=10s")
    (tmp_path / "bad.yml").write_text(content(planned, "prom01", "prometheus", "prometheus.yml"))
    proc = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "bad.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0


# ---------------------------------------------------------------- prometheus unit and handlers


def test_unit_flags_come_from_variables(tmp_path):
    planned = plan(tmp_path, "prometheus_retention_time=30d", "prometheus_retention_size=500GB")
    flags = exec_flags(content(planned, "prom01", "prometheus", "prometheus hardened unit"))
    assert flags[0] == "/usr/local/bin/prometheus"
    assert "--storage.tsdb.retention.time=30d" in flags
    assert "--storage.tsdb.retention.size=500GB" in flags
    assert "--web.enable-lifecycle" in flags
    assert "--storage.tsdb.path=/var/lib/prometheus" in flags


def test_without_a_sidecar_blocks_are_not_pinned_to_two_hours(planned):
    flags = exec_flags(content(planned, "prom01", "prometheus", "prometheus hardened unit"))
    assert not [f for f in flags if "block-duration" in f]


def test_with_a_sidecar_block_durations_are_two_hours(tmp_path):
    planned = plan(tmp_path, "thanos_enabled=true")
    flags = exec_flags(content(planned, "prom01", "prometheus", "prometheus hardened unit"))
    assert "--storage.tsdb.min-block-duration=2h" in flags
    assert "--storage.tsdb.max-block-duration=2h" in flags
    jobs = [j["job_name"] for j in prometheus_yml(planned)["scrape_configs"]]
    assert jobs[-1] == "thanos-sidecar"


def test_unit_is_hardened(planned):
    unit = content(planned, "prom01", "prometheus", "prometheus hardened unit")
    for line in (
        "User=prometheus",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/prometheus",
        "CapabilityBoundingSet=",
    ):
        assert line in unit.splitlines()


def test_config_changes_reload_and_unit_changes_restart(planned):
    config = task(planned, "prom01", "prometheus", "prometheus.yml")
    unit = task(planned, "prom01", "prometheus", "prometheus hardened unit")
    assert config.notify == ("reload prometheus",)
    assert "restart prometheus" in unit.notify
    reload = task(planned, "prom01", "prometheus", "reload prometheus")
    assert reload.args["cmd"].endswith("-X POST http://127.0.0.1:9090/-/reload")


def test_each_replica_waits_for_ready_before_the_next(planned):
    tasks = [t for t in planned["prom01"]["prometheus"] if not t.handler]
    last = tasks[-1]
    assert last.module.name == "wait_for"
    assert last.args["url"] == "http://127.0.0.1:9090/-/ready"
    handlers = [t.name for t in planned["prom01"]["prometheus"] if t.handler]
    assert handlers == ["reload prometheus", "restart prometheus", "prometheus ready after restart"]


def test_site_runs_the_replicas_one_at_a_time():
    # the shards' replicas, then the federation tier's global pair (deployer/monitoring/federation.py)
    plays = [p for p in load_site(DEFAULT_SITE) if "prometheus" in p.roles]
    assert [(p.hosts, p.serial) for p in plays] == [("prometheus", 1), ("prometheus_global", 1)]


def test_package_install_uses_the_distribution_binaries(tmp_path):
    planned = plan(tmp_path, "prometheus_install=package")
    names = [t.name for t in planned["prom01"]["prometheus"]]
    assert "prometheus OS package" in names
    assert not [n for n in names if "release archive" in n]
    assert exec_flags(content(planned, "prom01", "prometheus", "prometheus hardened unit"))[0] == (
        "/usr/bin/prometheus"
    )


# ---------------------------------------------------------------- alertmanager


def test_each_peer_names_every_other_peer_and_its_own_advertise_address(planned):
    flags = exec_flags(content(planned, "prom01", "alertmanager", "alertmanager hardened unit"))
    assert "--cluster.advertise-address=192.0.2.21:9094" in flags
    assert sorted(f for f in flags if f.startswith("--cluster.peer=")) == [
        "--cluster.peer=192.0.2.22:9094",
        "--cluster.peer=192.0.2.23:9094",
    ]
    assert "--cluster.listen-address=0.0.0.0:9094" in flags


RECEIVERS = textwrap.dedent(
    """\
    {"alertmanager_route": {"receiver": "oncall", "group_by": ["alertname"],
       "routes": [{"receiver": "gpu-team", "matchers": ["severity=\\"critical\\""]}]},
     "alertmanager_global": {"smtp_smarthost": "mail.example.org:587",
       "smtp_from": "gpumon@example.org", "smtp_auth_password": "s3cret-smtp"},
     "alertmanager_receivers": [
       {"name": "oncall", "pagerduty_configs": [{"routing_key": "s3cret-pd"}],
        "email_configs": [{"to": "oncall@example.org"}]},
       {"name": "gpu-team", "slack_configs": [{"api_url": "https://hooks.slack.com/services/s3cret",
         "channel": "#gpu"}], "webhook_configs": [{"url": "http://hooks.example.org/gpu"}]}]}"""
)


def test_routes_and_receivers_come_from_variables(tmp_path):
    planned = plan(tmp_path, RECEIVERS)
    config = yaml.safe_load(content(planned, "mon01", "alertmanager", "alertmanager.yml"))
    assert config["route"]["receiver"] == "oncall"
    assert config["route"]["routes"][0]["receiver"] == "gpu-team"
    kinds = {r["name"]: sorted(k for k in r if k.endswith("_configs")) for r in config["receivers"]}
    assert kinds == {
        "oncall": ["email_configs", "pagerduty_configs"],
        "gpu-team": ["slack_configs", "webhook_configs"],
    }


def test_alertmanager_config_is_secret_0600_and_checked_by_amtool(tmp_path):
    planned = plan(tmp_path, RECEIVERS)
    t = task(planned, "mon01", "alertmanager", "alertmanager.yml")
    assert t.args["mode"] == "600" and t.args["secret"] is True
    assert t.args["owner"] == "alertmanager"
    assert t.args["validate"] == "/usr/local/bin/amtool check-config %s"
    assert "content" in t.secret_args  # masked in reports and diffs


def test_rendered_alertmanager_config_passes_amtool(tmp_path):
    amtool = tool("amtool")
    planned = plan(tmp_path, RECEIVERS)
    path = tmp_path / "alertmanager.yml"
    path.write_text(content(planned, "mon01", "alertmanager", "alertmanager.yml"))
    proc = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Found 2 receivers" in proc.stdout or "2 receivers" in proc.stdout


def test_alertmanager_config_changes_reload_and_unit_changes_restart(planned):
    assert task(planned, "prom01", "alertmanager", "alertmanager.yml").notify == (
        "reload alertmanager",
    )
    assert (
        "restart alertmanager"
        in task(planned, "prom01", "alertmanager", "alertmanager hardened unit").notify
    )
    assert (
        task(planned, "prom01", "alertmanager", "reload alertmanager")
        .args["cmd"]
        .endswith("-X POST http://127.0.0.1:9093/-/reload")
    )


# ---------------------------------------------------------------- thanos


def role_task_names(planned: Any, host: str, role: str) -> list[str]:
    return [t.name for t in planned[host][role] if not t.handler]


def test_thanos_auto_without_an_archive_skips_with_a_warning(planned):
    for host, role in (("prom01", "thanos_sidecar"), ("mon01", "thanos_query")):
        tasks = [t for t in planned[host][role] if not t.handler]
        assert len(tasks) == 1 and tasks[0].name.startswith(
            f"WARNING: Thanos skipped on {host}: thanos_enabled is auto"
        )
        # Shown once (reported changed while its marker is missing), quiet afterwards.
        assert tasks[0].args["creates"] == "/var/lib/gpumon/thanos-skipped"


def test_thanos_auto_with_a_mirror_deploys(tmp_path):
    planned = plan(tmp_path, "thanos_release_mirror_url=http://mirror.invalid")
    t = task(planned, "mon01", "thanos_query", "thanos release archive (sha256 from")
    assert t.args["url"] == (
        "http://mirror.invalid/thanos-io/thanos/releases/download/v0.42.4/"
        "thanos-0.42.4.linux-amd64.tar.gz"
    )
    assert t.args["checksum_url"].endswith("/v0.42.4/sha256sums.txt")


def test_thanos_true_checks_the_archive_before_anything_changes(tmp_path):
    planned = plan(tmp_path, "thanos_enabled=true")
    first = planned["prom01"]["prometheus"][0]
    assert first.module.name == "wait_for"
    assert first.args["url"] == (
        "https://github.com/thanos-io/thanos/releases/download/v0.42.4/sha256sums.txt"
    )
    names = role_task_names(planned, "mon01", "thanos_query")
    probe = next(i for i, n in enumerate(names) if n.startswith("Thanos release reachable"))
    archive = next(i for i, n in enumerate(names) if n.startswith("thanos release archive"))
    assert probe < archive


def test_thanos_false_deploys_nothing_and_warns_nothing(tmp_path):
    planned = plan(tmp_path, "thanos_enabled=false")
    assert role_task_names(planned, "prom01", "thanos_sidecar") == []


def test_query_deduplicates_by_the_replica_label_over_every_sidecar(tmp_path):
    planned = plan(tmp_path, "thanos_enabled=true", "prometheus_replica_label=prom_replica")
    flags = exec_flags(content(planned, "mon01", "thanos_query", "thanos-query hardened unit"))
    assert flags[:2] == ["/usr/local/bin/thanos", "query"]
    assert "--query.replica-label=prom_replica" in flags
    assert [f for f in flags if f.startswith("--endpoint=")] == [
        "--endpoint=192.0.2.21:10901",
        "--endpoint=192.0.2.22:10901",
    ]
    assert "--deduplication.func=penalty" in flags


def test_sidecar_reads_the_local_tsdb_and_serves_store_api(tmp_path):
    planned = plan(tmp_path, "thanos_enabled=true")
    unit = content(planned, "prom01", "thanos_sidecar", "thanos-sidecar hardened unit")
    flags = exec_flags(unit)
    assert flags[:2] == ["/usr/local/bin/thanos", "sidecar"]
    assert "--tsdb.path=/var/lib/prometheus" in flags
    assert "--prometheus.url=http://127.0.0.1:9090" in flags
    assert "--grpc-address=0.0.0.0:10901" in flags
    assert not [f for f in flags if f.startswith("--objstore")]  # no upload configured
    assert "User=prometheus" in unit.splitlines()


def test_filesystem_objstore(tmp_path):
    planned = plan(
        tmp_path,
        "thanos_enabled=true",
        '{"thanos_objstore": {"type": "FILESYSTEM", "config": {"directory": "/srv/bucket"}}}',
    )
    objstore = yaml.safe_load(content(planned, "prom01", "thanos_sidecar", "object storage"))
    assert objstore == {"type": "FILESYSTEM", "config": {"directory": "/srv/bucket"}}
    unit = content(planned, "prom01", "thanos_sidecar", "thanos-sidecar hardened unit")
    assert "--objstore.config-file=/etc/thanos/objstore.yml" in exec_flags(unit)
    assert "ReadWritePaths=/var/lib/prometheus /srv/bucket" in unit.splitlines()
    bucket = task(planned, "prom01", "thanos_sidecar", "FILESYSTEM bucket directory")
    assert bucket.args["path"] == "/srv/bucket" and bucket.args["owner"] == "prometheus"


def test_s3_objstore_is_secret_and_0600(tmp_path):
    planned = plan(
        tmp_path,
        "thanos_enabled=true",
        '{"thanos_objstore": {"type": "S3", "config": {"bucket": "gpumon", '
        '"endpoint": "minio.example.org:9000", "access_key": "AK", "secret_key": "s3cret"}}}',
    )
    t = task(planned, "prom01", "thanos_sidecar", "object storage")
    assert t.args["mode"] == "600" and t.args["secret"] is True and "content" in t.secret_args
    assert t.args["owner"] == "prometheus"
    config = yaml.safe_load(t.args["content"])
    assert config["type"] == "S3" and config["config"]["secret_key"] == "s3cret"
    names = role_task_names(planned, "prom01", "thanos_sidecar")
    assert "FILESYSTEM bucket directory" not in names
