"""Lab topology files: what the default lab holds, scaling, addresses and file:line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.lab.topology import for_lab_name, load_topology, parse_topology
from deployer.yamlsrc import load_yaml_text


def topo(text: str, **kw):
    return parse_topology(load_yaml_text(text, "t.yml"), source="t.yml", **kw)


def test_default_topology_has_four_mixed_gpu_hosts_and_three_monitoring_hosts():
    t = load_topology()
    gpus = {h.name: (h.gpu_model, h.gpu_count, h.nvswitch) for h in t.group("gpu")}
    assert gpus == {
        "gpu01": ("H100", 8, True),
        "gpu02": ("H200", 8, True),
        "gpu03": ("A100", 4, False),
        "gpu04": ("V100", 8, False),
    }
    assert [h.name for h in t.group("prometheus")] == ["prom01", "prom02"]
    assert [h.name for h in t.group("alertmanager")] == ["prom01", "prom02", "mon01"]
    assert [h.name for h in t.group("thanos_query")] == ["mon01"]


def test_addresses_are_assigned_in_order_from_dot_11_and_the_bridge_keeps_dot_1():
    t = load_topology()
    assert t.gateway == "10.213.0.1"
    assert [h.address for h in t.hosts][:2] == ["10.213.0.11", "10.213.0.12"]
    assert len({h.address for h in t.hosts}) == len(t.hosts)


def test_gpu_nodes_fewer_keeps_the_first_ones_and_all_monitoring_hosts():
    t = load_topology(gpu_nodes=2)
    assert [h.name for h in t.group("gpu")] == ["gpu01", "gpu02"]
    assert len(t.group("alertmanager")) == 3


def test_gpu_nodes_more_adds_hosts_cycling_models_without_moving_existing_addresses():
    base = load_topology()
    t = load_topology(gpu_nodes=6)
    assert [(h.name, h.gpu_model) for h in t.group("gpu")][4:] == [
        ("gpu05", "H100"),
        ("gpu06", "H200"),
    ]
    for h in base.hosts:
        assert t.host(h.name).address == h.address


def test_explicit_address_is_kept_and_skipped_by_automatic_assignment():
    t = topo(
        "hosts:\n  a: {groups: [prometheus], address: 10.213.0.11}\n  b: {groups: [prometheus]}\n"
    )
    assert [h.address for h in t.hosts] == ["10.213.0.11", "10.213.0.12"]


def test_unknown_group_names_file_line_and_key():
    with pytest.raises(InputError) as err:
        topo("hosts:\n  a:\n    groups: [gpus]\n")
    assert (err.value.source, err.value.line, err.value.key) == ("t.yml", 3, "hosts.a.groups")


def test_gpu_host_without_model_is_refused():
    with pytest.raises(InputError, match="gpu_model must be one of") as err:
        topo("hosts:\n  g:\n    groups: [gpu]\n    gpu_count: 8\n")
    assert err.value.key == "hosts.g.gpu_model"


def test_gpu_count_out_of_range_is_refused_at_its_line():
    with pytest.raises(InputError) as err:
        topo("hosts:\n  g:\n    groups: [gpu]\n    gpu_model: H100\n    gpu_count: 0\n")
    assert err.value.line == 5


def test_gpu_keys_on_a_monitoring_host_are_refused():
    with pytest.raises(InputError, match="only hosts in group 'gpu'"):
        topo("hosts:\n  p:\n    groups: [prometheus]\n    gpu_count: 8\n")


def test_unknown_host_key_is_refused():
    with pytest.raises(InputError, match="unknown key") as err:
        topo("hosts:\n  p:\n    groups: [prometheus]\n    gpu_modle: H100\n")
    assert err.value.key == "hosts.p.gpu_modle"


def test_host_names_must_fit_an_interface_name():
    with pytest.raises(InputError, match="1-12 characters"):
        topo("hosts:\n  averyverylongname:\n    groups: [prometheus]\n")


def test_address_outside_the_subnet_is_refused():
    with pytest.raises(InputError, match="not a free host address"):
        topo("hosts:\n  a: {groups: [prometheus], address: 10.9.9.9}\n")


def test_bridge_address_cannot_be_given_to_a_host():
    with pytest.raises(InputError, match="not a free host address"):
        topo("hosts:\n  a: {groups: [prometheus], address: 10.213.0.1}\n")


def test_public_subnet_is_refused():
    with pytest.raises(InputError, match="private") as err:
        topo("network: {subnet: 8.8.8.0/24}\nhosts:\n  a: {groups: [prometheus]}\n")
    assert err.value.key == "network.subnet"


def test_missing_file_is_an_input_error_naming_it(tmp_path: Path):
    with pytest.raises(InputError) as err:
        load_topology(tmp_path / "nope.yml")
    assert str(tmp_path / "nope.yml") in str(err.value)


def test_named_lab_gets_its_own_bridge_and_subnet_with_the_same_host_octets():
    t = for_lab_name(load_topology(), "ci")
    default = load_topology()
    assert t.bridge != default.bridge and len(t.bridge) <= 15
    assert t.subnet != default.subnet
    assert [h.address.rsplit(".", 1)[1] for h in t.hosts] == [
        h.address.rsplit(".", 1)[1] for h in default.hosts
    ]
    assert for_lab_name(default, "default") is default
