"""file_sd targets from the inventory: one group per host, inventory metadata as target labels,
scrape tiers as per-target intervals, and the role's template rendering the very same files."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.monitoring import file_sd
from deployer.monitoring.file_sd import Target
from deployer.session import DeploySession, RunOptions

DEFAULTS = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "roles/prometheus/defaults/main.yml").read_text()
)

HOSTVARS: dict[str, dict[str, Any]] = {
    "gpu01": {
        "ansible_host": "10.0.0.11",
        "gpu_model": "H100",
        "gpu_count": 8,
        "cluster": "c1",
        "rack": "r1",
        "slurm_partition": "train",
        "scrape_tier": "training",
    },
    "gpu02": {
        "ansible_host": "10.0.0.12",
        "gpu_model": "A100",
        "gpu_count": 4,
        "rack": "r2",
        "scrape_tier": "inference",
    },
    "gpu03": {"gpu_model": "V100", "gpu_count": 8, "scrape_tier": "batch"},
    "prom01": {"ansible_host": "10.0.0.21"},
    "prom02": {"ansible_host": "10.0.0.22"},
    "mon01": {"ansible_host": "10.0.0.23"},
}
GROUPS = {
    "gpu": ["gpu01", "gpu02", "gpu03"],
    "monitoring": ["prom01", "prom02", "mon01"],
    "prometheus": ["prom01", "prom02"],
    "alertmanager": ["prom01", "prom02", "mon01"],
    "thanos_query": ["mon01"],
}


def variables(**overrides: Any) -> dict[str, Any]:
    v = {k: val for k, val in DEFAULTS.items() if k.startswith(("prometheus_", "metrics_store_"))}
    v.update(
        groups=GROUPS,
        hostvars=HOSTVARS,
        prometheus_thanos_sidecar=False,
        prometheus_port=9090,
    )
    v.update(overrides)
    return v


def by_node(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {g["labels"]["node"]: g for g in groups}


def test_one_dcgm_group_per_gpu_host_at_the_exporter_port():
    dcgm = file_sd.file_sd_targets(variables())["dcgm"]
    assert [g["targets"] for g in dcgm] == [["10.0.0.11:9400"], ["10.0.0.12:9400"], ["gpu03:9400"]]


def test_gpu_targets_carry_the_inventory_metadata_as_labels():
    gpu01 = by_node(file_sd.file_sd_targets(variables())["dcgm"])["gpu01"]["labels"]
    assert gpu01 == {
        "node": "gpu01",
        "cluster": "c1",
        "rack": "r1",
        "gpu_model": "H100",
        "slurm_partition": "train",
        "scrape_tier": "training",
        "__scrape_interval__": "5s",
        "__scrape_timeout__": "5s",
    }


def test_labels_of_unset_host_vars_are_left_out():
    gpu02 = by_node(file_sd.file_sd_targets(variables())["dcgm"])["gpu02"]["labels"]
    assert "cluster" not in gpu02 and "slurm_partition" not in gpu02


def test_scrape_tier_sets_the_tier_interval_and_timeout():
    groups = by_node(file_sd.file_sd_targets(variables())["node"])
    assert groups["gpu02"]["labels"]["__scrape_interval__"] == "30s"
    assert groups["gpu02"]["labels"]["__scrape_timeout__"] == "10s"


def test_an_unknown_tier_keeps_the_global_interval_but_still_labels_the_tier():
    gpu03 = by_node(file_sd.file_sd_targets(variables())["dcgm"])["gpu03"]["labels"]
    assert "__scrape_interval__" not in gpu03
    assert gpu03["scrape_tier"] == "batch"


def test_tiers_are_configurable():
    tiers = {"batch": {"interval": "1m", "timeout": "20s"}}
    groups = by_node(file_sd.file_sd_targets(variables(prometheus_scrape_tiers=tiers))["dcgm"])
    assert groups["gpu03"]["labels"]["__scrape_interval__"] == "1m"
    assert "__scrape_interval__" not in groups["gpu01"]["labels"]


def test_node_job_covers_gpu_and_monitoring_hosts_once_each():
    nodes = [g["labels"]["node"] for g in file_sd.file_sd_targets(variables())["node"]]
    assert nodes == ["gpu01", "gpu02", "gpu03", "prom01", "prom02", "mon01"]


def test_monitoring_targets_are_labelled_with_their_node_only():
    targets = file_sd.file_sd_targets(variables())
    assert targets["prometheus"] == [
        {"targets": ["10.0.0.21:9090"], "labels": {"node": "prom01"}},
        {"targets": ["10.0.0.22:9090"], "labels": {"node": "prom02"}},
    ]
    assert [g["targets"][0] for g in targets["alertmanager"]] == [
        "10.0.0.21:9093",
        "10.0.0.22:9093",
        "10.0.0.23:9093",
    ]


def test_sidecar_targets_only_when_the_sidecar_is_on():
    assert file_sd.file_sd_targets(variables())["thanos-sidecar"] == []
    on = file_sd.file_sd_targets(variables(prometheus_thanos_sidecar="true"))["thanos-sidecar"]
    assert [g["targets"][0] for g in on] == ["10.0.0.21:10902", "10.0.0.22:10902"]


def test_rendered_file_is_stable_json_with_a_trailing_newline():
    text = file_sd.render(file_sd.file_sd_targets(variables())["prometheus"])
    assert text.endswith("]\n")
    assert json.loads(text)[0]["targets"] == ["10.0.0.21:9090"]
    assert text == file_sd.render(json.loads(text))


def test_rendered_file_has_one_target_group_per_line():
    groups = file_sd.file_sd_targets(variables())["node"]
    lines = file_sd.render(groups).splitlines()
    assert lines[0] == "[" and lines[-1] == "]"
    assert [json.loads(line.rstrip(",")) for line in lines[1:-1]] == groups


def test_an_empty_job_renders_an_empty_list():
    assert file_sd.render([]) == "[]\n"


def test_a_job_of_one_host_renders_its_group_on_the_line_between_the_brackets():
    group = {"labels": {"node": "gpu01"}, "targets": ["10.0.0.11:9400"]}
    text = file_sd.render([group])
    assert text == '[\n  {"labels": {"node": "gpu01"}, "targets": ["10.0.0.11:9400"]}\n]\n'
    assert json.loads(text) == [group]


def test_targets_file_of_a_job_is_that_jobs_groups_rendered():
    v = variables(prometheus_thanos_sidecar=True)
    for job, groups in file_sd.file_sd_targets(v).items():
        assert file_sd.targets_file(v, job) == file_sd.render(groups), job


def test_a_targets_file_is_its_groups_encoded_whatever_the_label_text():
    """The GPU jobs' files are written around each host's labels encoded once: byte for byte
    what encoding each group whole gives, for quotes, backslashes, non-ASCII text and an IPv6
    address too, whichever of the two is asked first."""
    odd = {
        "gpu01": {"ansible_host": "fd00::11", "rack": 'r"1\\x', "cluster": "příbor",
                  "gpu_model": "H100", "scrape_tier": "training"},
        "gpu02": {"ansible_host": "10.0.0.12", "rack": "r\tab\n", "slurm_partition": 7},
        "gpu03": {},
    }  # fmt: skip
    for first in ("file", "groups"):
        v = variables(hostvars={**HOSTVARS, **odd})
        for job in file_sd.LABELLED_JOBS:
            if first == "file":
                text = file_sd.targets_file(v, job)
                groups = file_sd.job_targets(v, job)
            else:
                groups = file_sd.job_targets(v, job)
                text = file_sd.targets_file(v, job)
            whole = [json.dumps(g, sort_keys=True) for g in groups]
            assert text == "[\n  " + ",\n  ".join(whole) + "\n]\n", (first, job)
            assert json.loads(text) == groups


@pytest.mark.parametrize("most_shared", [1024, 1], ids=["shared", "past-the-bound"])
def test_hosts_of_equal_label_values_share_their_labels_and_each_keeps_its_own_name(
    monkeypatch: pytest.MonkeyPatch, most_shared: int
) -> None:
    """Hosts whose label variables read the same (a rack's) are labelled and encoded from one
    shared set, around each host's own name: each host's labels are what its own values give
    (a label is its value's text: 1, True, "1" and 1.0 each their own), and the file is what
    encoding each group whole gives, also for odd names, a label variable named ``node``, a
    value holding the text the names are encoded around, and past the bound on shared sets."""
    monkeypatch.setattr(file_sd, "_SHARED_MIN", most_shared)
    rack = {"rack": "r1", "gpu_model": "H100", "scrape_tier": "training"}
    fleet = {
        "gpu01": {**rack, "ansible_host": "10.0.0.11"},
        "gpu02": {**rack},
        'gpu"03\\ü': {**rack, "ansible_host": "fd00::13"},
        "gpu04": {**rack, "rack": 1},
        "gpu05": {**rack, "rack": True},
        "gpu06": {**rack, "rack": "1"},
        "gpu07": {**rack, "rack": 1.0},
        "gpu08": {**rack, "cluster": "\x00gpumon-node\x00"},
    }
    for names in (None, ["cluster", "rack", "gpu_model", "node"]):
        extra = {} if names is None else {"prometheus_target_label_vars": names}
        gpus = {
            **fleet,
            "gpu09": {**rack, "node": "n9"},
            "gpu10": {**rack, "node": "\x00gpumon-node\x00"},
        }
        hostvars = {**HOSTVARS, **gpus}
        v = variables(hostvars=hostvars, groups={**GROUPS, "gpu": list(gpus)}, **extra)
        own = file_sd._Labels(v)
        for job in file_sd.LABELLED_JOBS:
            groups = file_sd.job_targets(v, job)
            members = file_sd.job_members(v, job)
            assert len(groups) == len(members)
            for host, g in zip(members, groups, strict=True):
                values = tuple(hostvars[host].get(k) for k in own.reads)
                assert g["labels"] == own.of(values, host), host
            whole = [json.dumps(g, sort_keys=True) for g in groups]
            assert file_sd.targets_file(v, job) == "[\n  " + ",\n  ".join(whole) + "\n]\n"
        by = {
            g["targets"][0].split(":9400")[0]: g["labels"] for g in file_sd.job_targets(v, "dcgm")
        }
        assert [by[h]["rack"] for h in ("gpu04", "gpu05", "gpu06", "gpu07")] == [
            "1",
            "True",
            "1",
            "1.0",
        ]
        assert by["gpu09"]["node"] == ("gpu09" if names is None else "n9")
        assert len(file_sd._labels_of(v)._shared) <= max(most_shared, len(hostvars) // 8)


def test_generating_targets_leaves_the_garbage_collector_running():
    file_sd.file_sd_targets(variables())
    assert gc.isenabled()
    with pytest.raises(KeyError):
        file_sd.job_targets(variables(hostvars={}), "dcgm")
    assert gc.isenabled()


def test_expected_targets_list_every_job_instance_and_node():
    expected = file_sd.expected_targets(variables())
    assert Target("dcgm", "10.0.0.11:9400", "gpu01") in expected
    assert Target("node", "10.0.0.23:9100", "mon01") in expected
    assert len(expected) == 3 + 6 + 2 + 3


# ---------------------------------------------------------------- the role renders the same files

INVENTORY = """\
all:
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8, cluster: c1, rack: r1,
            slurm_partition: train, scrape_tier: training}
    gpu02: {ansible_host: 192.0.2.12, gpu_model: A100, gpu_count: 4, rack: r2,
            scrape_tier: inference, nvswitch: false}
    gpu03: {gpu_model: V100, gpu_count: 8}
    prom01: {ansible_host: 192.0.2.21}
    prom02: {ansible_host: 192.0.2.22}
  children:
    gpu:
      hosts: {gpu01: {}, gpu02: {}, gpu03: {}}
    prometheus:
      hosts: {prom01: {}, prom02: {}}
    alertmanager:
      hosts: {prom01: {}, prom02: {}}
"""

SITE = """\
- name: Prometheus HA pair
  hosts: prometheus
  serial: 1
  roles: [prometheus, thanos_sidecar]
"""


@pytest.mark.parametrize("extra", [[], ["thanos_enabled=true"]], ids=["plain", "sidecar"])
def test_role_template_renders_exactly_what_file_sd_computes(tmp_path, extra):
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    (tmp_path / "site.yml").write_text(SITE)
    session = DeploySession.load(
        RunOptions(
            inventory=tmp_path / "inventory.yml", site=tmp_path / "site.yml", extra_vars=extra
        )
    )
    planner = session.planner
    assert planner is not None
    play = session.plays[0]
    expected = file_sd.file_sd_targets(planner.host_vars("prom01", play))
    written = {
        Path(t.args["dest"]).stem: t.args["content"]
        for t in session.plans[0].plays[0].tasks
        if t.name.startswith("file_sd targets")
    }
    jobs = ["dcgm", "node", "prometheus", "alertmanager"] + (["thanos-sidecar"] if extra else [])
    assert list(written) == jobs
    for job in jobs:
        assert written[job] == file_sd.render(expected[job]), job
    assert json.loads(written["dcgm"])[0]["labels"]["gpu_model"] == "H100"


def test_targets_files_are_the_only_tasks_tagged_targets(tmp_path):
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    (tmp_path / "site.yml").write_text(SITE)
    session = DeploySession.load(
        RunOptions(
            inventory=tmp_path / "inventory.yml",
            site=tmp_path / "site.yml",
            tags=frozenset({"targets"}),
        )
    )
    names = [t.name for t in session.plans[0].plays[0].tasks]
    assert names == [
        "prometheus configuration directories (/etc/prometheus)",
        "prometheus configuration directories (/etc/prometheus/rules)",
        "prometheus configuration directories (/etc/prometheus/file_sd)",
        "file_sd targets of job dcgm",
        "file_sd targets of job node",
        "file_sd targets of job prometheus",
        "file_sd targets of job alertmanager",
    ]


def test_targets_command_converges_only_the_replicas_narrowed_by_limit(tmp_path):
    # The replicas are the Prometheus play's hosts, narrowed by --limit as a set (a pattern
    # built as "prometheus:&LIMIT" broke on "prom01,prom02": tests/unit/test_targets.py).
    from deployer.monitoring.targets import load_session

    (tmp_path / "inventory.yml").write_text(INVENTORY)

    def replicas(limit):
        options = RunOptions(inventory=tmp_path / "inventory.yml", limit=limit)
        return [p.host for p in load_session(options).plans]

    assert replicas(None) == ["prom01", "prom02"]
    assert replicas("prom01") == ["prom01"]


# ---------------------------------------------------------------- the replica's cluster label


def test_the_cluster_the_scraped_hosts_agree_on_is_the_replicas_default():
    assert file_sd.common_cluster(variables(), "gpumon") == "c1"


def test_without_a_cluster_on_any_host_the_fallback_is_the_replicas_cluster():
    hostvars = {h: {k: v for k, v in hv.items() if k != "cluster"} for h, hv in HOSTVARS.items()}
    assert file_sd.common_cluster(variables(hostvars=hostvars), "gpumon") == "gpumon"


def test_hosts_naming_different_clusters_leave_the_replica_at_the_fallback():
    hostvars = {**HOSTVARS, "gpu02": {**HOSTVARS["gpu02"], "cluster": "c2"}}
    assert file_sd.common_cluster(variables(hostvars=hostvars), "gpumon") == "gpumon"


def test_an_inventory_naming_the_cluster_on_gpu_hosts_only_labels_the_replica_the_same(tmp_path):
    # the lab's inventory: cluster set on the GPU hosts, not on the monitoring hosts; the
    # replica's external label (which labels its own alerts) must not say another cluster
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    (tmp_path / "site.yml").write_text(SITE)
    session = DeploySession.load(
        RunOptions(inventory=tmp_path / "inventory.yml", site=tmp_path / "site.yml")
    )
    config = next(
        t.args["content"]
        for t in session.plans[0].plays[0].tasks
        if t.name.startswith("prometheus.yml")
    )
    assert yaml.safe_load(config)["global"]["external_labels"]["cluster"] == "c1"
