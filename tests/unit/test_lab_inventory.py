"""The inventory and known_hosts the lab writes for itself."""

from __future__ import annotations

from pathlib import Path

import yaml

from deployer.lab.inventory import (
    inventory_data,
    known_hosts_lines,
    render_inventory,
    write_inventory,
)
from deployer.lab.topology import load_topology

MIRROR = {
    "apt_mirror_url": "http://10.213.0.1:8680/debian",
    "nvidia_repo_url": "http://10.213.0.1:8680/cuda/debian12/x86_64/",
    "nvidia_repo_key_url": "http://10.213.0.1:8680/keys/k.asc",
    "release_mirror_url": "http://10.213.0.1:8680/releases",
}


def data():
    return inventory_data(
        load_topology(),
        private_key=Path("/s/id_ed25519"),
        known_hosts=Path("/s/known_hosts"),
        mirror=MIRROR,
    )


def test_all_vars_carry_connection_key_known_hosts_and_mirror_vars():
    v = data()["all"]["vars"]
    assert v["ansible_user"] == "root"
    assert v["ansible_ssh_private_key_file"] == "/s/id_ed25519"
    assert v["gpumon_known_hosts_file"] == "/s/known_hosts"
    assert v["gpumon_host_key_policy"] == "verify"
    for key, value in MIRROR.items():
        assert v[key] == value


def test_gpu_hosts_carry_model_count_nvswitch_and_topology_vars():
    gpu01 = data()["all"]["hosts"]["gpu01"]
    assert gpu01["ansible_host"] == "10.213.0.11"
    assert (gpu01["gpu_model"], gpu01["gpu_count"], gpu01["nvswitch"]) == ("H100", 8, True)
    assert gpu01["rack"] == "r1" and gpu01["scrape_tier"] == "training"


def test_monitoring_hosts_have_no_gpu_vars():
    prom01 = data()["all"]["hosts"]["prom01"]
    assert "gpu_model" not in prom01 and "gpu_count" not in prom01


def test_groups_follow_the_contract_with_monitoring_as_parent():
    children = data()["all"]["children"]
    assert set(children["gpu"]["hosts"]) == {"gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06"}
    mon = children["monitoring"]["children"]
    assert set(mon["prometheus"]["hosts"]) == {"prom01", "prom02"}
    assert set(mon["alertmanager"]["hosts"]) == {"prom01", "prom02", "mon01"}
    assert set(mon["thanos_query"]["hosts"]) == {"mon01"}


def test_connection_overrides_replace_address_and_add_port():
    d = inventory_data(
        load_topology(),
        private_key=Path("/k"),
        known_hosts=Path("/kh"),
        mirror=MIRROR,
        connection={"gpu01": {"ansible_host": "127.0.0.1", "ansible_port": 2222}},
    )
    assert d["all"]["hosts"]["gpu01"]["ansible_host"] == "127.0.0.1"
    assert d["all"]["hosts"]["gpu01"]["ansible_port"] == 2222


def test_written_inventory_is_yaml_that_reads_back_and_says_gpus_are_simulated(tmp_path: Path):
    path = tmp_path / "inventory.yml"
    write_inventory(path, data())
    text = path.read_text()
    assert "SIMULATED" in text
    assert yaml.safe_load(text) == data()
    assert render_inventory(data()) == text


def test_known_hosts_lists_name_and_address_per_host_sorted():
    text = known_hosts_lines(
        {
            "b": (["b", "10.0.0.2"], "ssh-ed25519 BBB"),
            "a": (["a", "10.0.0.1"], "ssh-ed25519 AAA"),
        }
    )
    assert text == "a,10.0.0.1 ssh-ed25519 AAA\nb,10.0.0.2 ssh-ed25519 BBB\n"
