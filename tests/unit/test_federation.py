"""The federation tier: the global pair's federate job, its rules, what the shards stop doing, and
the one variable (gpumon_global_tier) refused when it is unknown or contradicts the inventory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from deployer import session as session_mod
from deployer.cli import _register_subcommands, cli
from deployer.errors import InputError
from deployer.session import DeploySession, RunOptions

REPO = Path(__file__).resolve().parents[2]

INVENTORY = """\
all:
  vars: {{gpumon_global_tier: {mode}}}
  hosts:
    gpu01: {{ansible_host: 192.0.2.11, cluster: c1, gpu_model: H100}}
    gpu02: {{ansible_host: 192.0.2.12, cluster: c1, gpu_model: H100}}
    prom01: {{ansible_host: 192.0.2.21, prometheus_shard: a}}
    prom02: {{ansible_host: 192.0.2.22, prometheus_shard: a}}
    prom03: {{ansible_host: 192.0.2.23, prometheus_shard: b}}
    prom04: {{ansible_host: 192.0.2.24, prometheus_shard: b}}
    glob01: {{ansible_host: 192.0.2.31}}
    glob02: {{ansible_host: 192.0.2.32}}
    vm01: {{ansible_host: 192.0.2.41}}
  children:
    gpu:
      hosts: {{gpu01: {{}}, gpu02: {{}}}}
    prometheus:
      hosts: {{prom01: {{}}, prom02: {{}}, prom03: {{}}, prom04: {{}}}}
    prometheus_global:
      hosts: {{{globals_}}}
    metrics_store:
      hosts: {{vm01: {{}}}}
"""
GLOBALS = "glob01: {}, glob02: {}"


def load(tmp_path: Path, mode: str = "both", globals_: str = GLOBALS) -> DeploySession:
    (tmp_path / "inventory.yml").write_text(INVENTORY.format(mode=mode, globals_=globals_))
    shutil.copy(REPO / "site.yml", tmp_path / "site.yml")
    return DeploySession.load(
        RunOptions(inventory=tmp_path / "inventory.yml", site=tmp_path / "site.yml")
    )


def written(session: DeploySession, host: str) -> dict[str, str]:
    """dest -> content of the prometheus role's files on ``host``."""
    plan = next(p for p in session.plans if p.host == host)
    return {
        str(t.args["dest"]): t.args.get("content", "")
        for play in plan.plays
        for t in play.tasks
        if "dest" in t.args
    }


def config(session: DeploySession, host: str) -> dict[str, Any]:
    return yaml.safe_load(written(session, host)["/etc/prometheus/prometheus.yml"])


def test_the_global_pair_federates_both_replicas_of_every_shard_with_their_labels(tmp_path):
    jobs = config(load(tmp_path), "glob01")["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["federate"]
    job = jobs[0]
    assert job["honor_labels"] is True and job["metrics_path"] == "/federate"
    # a stopped shard's records go stale with the failed scrape, not 5 minutes later
    assert job["honor_timestamps"] is False
    assert job["params"] == {"match[]": ['{__name__=~"cluster_model:.+"}']}
    assert [(g["targets"], g["labels"]) for g in job["static_configs"]] == [
        (["192.0.2.21:9090"], {"node": "prom01", "shard": "a"}),
        (["192.0.2.22:9090"], {"node": "prom02", "shard": "a"}),
        (["192.0.2.23:9090"], {"node": "prom03", "shard": "b"}),
        (["192.0.2.24:9090"], {"node": "prom04", "shard": "b"}),
    ]


def test_the_global_pair_loads_the_global_rules_and_no_gpu_targets(tmp_path):
    files = written(load(tmp_path), "glob02")
    rules = sorted(d for d in files if d.startswith("/etc/prometheus/rules/"))
    assert rules == ["/etc/prometheus/rules/global-federation.yml"]
    assert not [d for d in files if d.startswith("/etc/prometheus/file_sd/")]


def removed(session: DeploySession, host: str) -> list[str]:
    """The rule files the prometheus role removes from ``host``."""
    plan = next(p for p in session.plans if p.host == host)
    return sorted(
        str(t.args["path"])
        for play in plan.plays
        for t in play.tasks
        if t.args.get("state") == "absent"
        and str(t.args.get("path", "")).startswith("/etc/prometheus/rules/")
    )


def test_a_replica_moved_between_a_shard_and_the_global_pair_drops_the_rules_it_no_longer_loads(
    tmp_path,
):
    # Prometheus loads every *.yml of the rules directory: a file left from the other tier would
    # go on being evaluated (the global pair firing the shards' GPU alerts on federated records)
    session = load(tmp_path)
    rules = "/etc/prometheus/rules/"
    assert removed(session, "glob01") == [
        f"{rules}{n}.yml" for n in ("gpu-alerts", "gpu-recording", "meta-alerts", "shard-recording")
    ]
    assert removed(session, "prom01") == [f"{rules}global-federation.yml"]


def test_the_role_knows_every_rule_file_it_can_write():
    defaults = yaml.safe_load((REPO / "roles/prometheus/defaults/main.yml").read_text())
    templates = (REPO / "roles/prometheus/templates/rules").glob("*.yml.j2")
    assert sorted(defaults["prometheus_rule_files_product"]) == sorted(
        t.name.removesuffix(".yml.j2") for t in templates
    )


def test_a_shard_replica_records_the_shard_boundary_and_is_not_federating(tmp_path):
    session = load(tmp_path)
    files = written(session, "prom03")
    assert "/etc/prometheus/rules/shard-recording.yml" in files
    assert "federate" not in [j["job_name"] for j in config(session, "prom03")["scrape_configs"]]


@pytest.mark.parametrize(
    ("mode", "shard_writes"), [("both", True), ("federation", False)], ids=["both", "federation"]
)
def test_remote_write_follows_the_mode_and_the_global_pair_never_writes(
    tmp_path, mode, shard_writes
):
    session = load(tmp_path, mode)
    assert ("remote_write" in config(session, "prom01")) is shard_writes
    assert "remote_write" not in config(session, "glob01")


def test_remote_write_alone_without_a_global_pair_is_as_before(tmp_path):
    session = load(tmp_path, "remote_write", globals_="")
    assert "remote_write" in config(session, "prom01")
    names = [j["job_name"] for j in config(session, "prom01")["scrape_configs"]]
    assert "federate" not in names


def test_the_global_replicas_restart_only_while_their_own_peer_serves(tmp_path):
    session = load(tmp_path)
    play = next(p for p in session.plays if p.hosts == "prometheus_global")
    assert list(session.planner.host_vars("glob01", play)["prometheus_ha_peers"]) == [
        "glob01",
        "glob02",
    ]


def test_the_global_pair_is_its_own_play_after_the_shards_one_replica_at_a_time():
    site = yaml.safe_load((REPO / "site.yml").read_text())
    names = [p["hosts"] for p in site]
    play = next(p for p in site if p["hosts"] == "prometheus_global")
    assert names.index("prometheus_global") > names.index("prometheus")
    assert play["serial"] == 1 and play["roles"] == ["prometheus"]


@pytest.mark.parametrize(
    ("mode", "globals_", "fragment"),
    [
        ("federate", GLOBALS, "'federate' is not one of remote_write, federation, both"),
        ("remote_write", GLOBALS, "the prometheus_global group has hosts"),
        ("federation", "", "the prometheus_global group has no host"),
    ],
    ids=["unknown", "hosts-without-federation", "federation-without-hosts"],
)
def test_a_mode_that_is_unknown_or_contradicts_the_inventory_is_refused(
    tmp_path, mode, globals_, fragment
):
    with pytest.raises(InputError) as exc:
        load(tmp_path, mode, globals_).plans  # noqa: B018 (planning renders the templates)
    assert exc.value.key == "gpumon_global_tier" and fragment in exc.value.message
    assert "host " in exc.value.message


def test_a_bad_mode_exits_2_naming_the_key_and_touches_no_host(tmp_path, monkeypatch):
    def refuse(self, host):
        raise AssertionError(f"a connection to {host} was attempted")

    monkeypatch.setattr(session_mod.DeploySession, "open_connection", refuse)
    (tmp_path / "inventory.yml").write_text(INVENTORY.format(mode="fed", globals_=GLOBALS))
    _register_subcommands()
    result = CliRunner().invoke(
        cli, ["up", "-i", str(tmp_path / "inventory.yml"), "--site", str(REPO / "site.yml")]
    )
    assert result.exit_code == 2, result.output
    assert "gpumon_global_tier" in result.output and "'fed' is not one of" in result.output


@pytest.mark.parametrize(("mode", "queues"), [("both", 1), ("federation", 0)])
def test_status_expects_the_shards_store_queues_only_when_they_remote_write(tmp_path, mode, queues):
    from deployer.monitoring.expect import load_expectation

    (tmp_path / "inventory.yml").write_text(INVENTORY.format(mode=mode, globals_=GLOBALS))
    exp = load_expectation(tmp_path / "inventory.yml")
    assert [w.host for w in exp.store.writers] == ["prom01", "prom02", "prom03", "prom04"]
    assert {len(w.queues) for w in exp.store.writers} == {queues}


def _federate_and_alerting(session: DeploySession, host: str) -> tuple[dict, dict]:
    config = yaml.safe_load(written(session, host)["/etc/prometheus/prometheus.yml"])
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "federate")
    return job, config["alerting"]["alertmanagers"][0]


def test_under_tls_the_federate_job_sends_the_credential_the_rotation_has_clients_send(
    tmp_path: Path,
):
    from deployer.tls import material, rotation

    tls = ["gpumon_tls=true", f"gpumon_tls_dir={tmp_path / 'ca'}"]

    def plan_with(password: str) -> DeploySession:
        material.forget()
        (tmp_path / "inventory.yml").write_text(INVENTORY.format(mode="both", globals_=GLOBALS))
        shutil.copy(REPO / "site.yml", tmp_path / "site.yml")
        extra = [*tls, f"gpumon_basic_auth_password={password}"]
        return DeploySession.load(
            RunOptions(
                inventory=tmp_path / "inventory.yml", site=tmp_path / "site.yml", extra_vars=extra
            )
        )

    try:
        job, am = _federate_and_alerting(plan_with("old-password-1234"), "glob01")
        assert job["scheme"] == "https" and job["tls_config"] == am["tls_config"]
        assert job["basic_auth"] == am["basic_auth"]
        plan_with("new-password-5678")  # widen: clients still send the old credential
        assert rotation.advance(tmp_path / "ca") == "switch"
        job, am = _federate_and_alerting(plan_with("new-password-5678"), "glob01")
        assert job["basic_auth"] == am["basic_auth"]
        assert job["basic_auth"]["password_file"].endswith("/client-password-2")
    finally:
        material.forget()


# ---------------------------------------------------------------- what status expects of the tier


def test_status_expects_the_global_pair_apart_from_the_shards(tmp_path: Path):
    """The prometheus role runs in two plays: status reads both, judges the shard replicas as the
    tier it was, and the global pair on its own (federate targets, the global rules)."""
    from deployer.monitoring import status
    from deployer.monitoring.file_sd import Target

    load(tmp_path, "both")
    exp = status.load_expectation(tmp_path / "inventory.yml")
    assert [r.host for r in exp.replicas] == ["prom01", "prom02", "prom03", "prom04"]
    assert [(r.host, r.url, r.replica) for r in exp.global_replicas] == [
        ("glob01", "http://192.0.2.31:9090", "glob01"),
        ("glob02", "http://192.0.2.32:9090", "glob02"),
    ]
    assert exp.global_targets == [
        Target("federate", f"192.0.2.2{i}:9090", f"prom0{i}") for i in range(1, 5)
    ]
    assert exp.global_replicas[0].loads == ("global-federation.yml",)
    assert exp.replicas[0].loads == (
        "gpu-alerts.yml",
        "gpu-recording.yml",
        "meta-alerts.yml",
        "shard-recording.yml",
    )
    # the shards' targets are not the global pair's, and only the shards write to the store
    assert not {t.job for t in exp.targets} & {"federate"}
    assert [w.host for w in exp.store.writers] == ["prom01", "prom02", "prom03", "prom04"]
    assert {"glob01", "glob02"} <= set(exp.ssh)


def test_status_expects_no_global_pair_without_the_federation_tier(tmp_path: Path):
    from deployer.monitoring import status

    load(tmp_path, "remote_write", globals_="")
    exp = status.load_expectation(tmp_path / "inventory.yml")
    assert exp.global_replicas == [] and exp.global_targets == []
    assert len(exp.replicas) == 4
