"""Lab topology files: what the default lab holds, scaling, addresses and file:line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.lab.gpusim import hardware_for
from deployer.lab.gpusim.models import MODELS
from deployer.lab.lab import changes_in_place
from deployer.lab.topology import for_lab_name, load_topology, parse_topology
from deployer.yamlsrc import load_yaml_text


def topo(text: str, **kw):
    return parse_topology(load_yaml_text(text, "t.yml"), source="t.yml", **kw)


def test_default_topology_has_six_mixed_gpu_hosts_and_three_monitoring_hosts():
    t = load_topology()
    gpus = {h.name: (h.gpu_model, h.gpu_count, h.nvswitch) for h in t.group("gpu")}
    assert gpus == {
        "gpu01": ("H100", 8, True),
        "gpu02": ("H200", 8, True),
        "gpu03": ("A100", 4, False),
        "gpu04": ("V100", 8, False),
        "gpu05": ("H100", 2, False),
        "gpu06": ("L40S", 2, False),
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
    t = load_topology(gpu_nodes=8)
    assert [(h.name, h.gpu_model) for h in t.group("gpu")][6:] == [
        ("gpu07", "H100"),
        ("gpu08", "H200"),
    ]
    for h in base.hosts:
        assert t.host(h.name).address == h.address


def test_the_default_lab_has_a_gpu_in_mig_mode_laid_out_as_the_real_h100_capture():
    h = load_topology().host("gpu05")
    assert h.mig_gpus == [0]
    [gpu0, gpu1] = hardware_for(h.gpu_model, h.gpu_count, h.name, h.nvswitch, h.mig)["gpus"]
    assert [(gi["gi_id"], gi["profile"]) for gi in gpu0["mig"]] == [
        (2, "3g.40gb"), (3, "2g.20gb"), (9, "1g.10gb"), (10, "1g.10gb")]  # fmt: skip
    assert gpu1["mig"] is None


def test_the_default_lab_has_boards_without_a_memory_sensor():
    h = load_topology().host("gpu06")
    assert not MODELS[h.gpu_model].memory_sensor


def test_a_mig_layout_applies_to_every_gpu_when_given_as_a_list():
    t = topo("hosts:\n  g:\n    groups: [gpu]\n    gpu_model: A100\n    gpu_count: 2\n"
             "    mig: [2g.20gb, 2g.20gb]\n")  # fmt: skip
    assert t.host("g").mig_gpus == [0, 1]


@pytest.mark.parametrize(
    ("mig", "message"),
    [
        ("[4g.40gb]", "not simulated"),  # no capture shows an H100 4g.40gb
        ("[3g.40gb, 3g.40gb, 3g.40gb]", "no room left"),
        ("{7: [1g.10gb]}", "no GPU 7"),
        ("yes", "a list of GPU instance profiles"),
    ],
)
def test_a_mig_layout_the_captures_cannot_back_is_refused_at_its_line(mig: str, message: str):
    with pytest.raises(InputError, match=message) as err:
        topo(f"hosts:\n  g:\n    groups: [gpu]\n    gpu_model: H100\n    gpu_count: 2\n"
             f"    mig: {mig}\n")  # fmt: skip
    assert (err.value.line, err.value.key) == (6, "hosts.g.mig")


def test_mig_on_a_gpu_without_mig_is_refused():
    with pytest.raises(InputError, match="has no MIG") as err:
        topo("hosts:\n  g:\n    groups: [gpu]\n    gpu_model: L40S\n    gpu_count: 1\n"
             "    mig: [1g.10gb]\n")  # fmt: skip
    assert err.value.key == "hosts.g.mig"


def test_the_topology_accepts_exactly_the_simulated_models():
    with pytest.raises(InputError, match="gpu_model must be one of"):
        topo("hosts:\n  g:\n    groups: [gpu]\n    gpu_model: L4\n    gpu_count: 1\n")


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


# ------------------------------------------------------------ changing a running lab's topology


def test_more_gpu_hosts_are_added_beside_the_running_ones_without_restarting_them():
    assert changes_in_place(load_topology(), load_topology(gpu_nodes=8))


def test_fewer_gpu_hosts_at_the_end_are_removed_without_restarting_the_rest():
    assert changes_in_place(load_topology(gpu_nodes=8), load_topology())


def test_a_change_that_moves_a_kept_host_s_address_takes_the_lab_down_first():
    # Below six GPU hosts the monitoring hosts move up to the freed addresses.
    assert not changes_in_place(load_topology(gpu_nodes=2), load_topology(gpu_nodes=3))


def test_the_same_hosts_read_from_another_file_change_nothing():
    text = "hosts:\n  g1: {groups: [gpu], gpu_model: H100, gpu_count: 8}\n"
    one = parse_topology(load_yaml_text(text, "a.yml"), source="a.yml")
    other = parse_topology(load_yaml_text(text, "b.yml"), source="b.yml")
    assert changes_in_place(one, other)


def test_a_kept_host_with_other_gpus_takes_the_lab_down_first():
    before = topo("hosts:\n  g1: {groups: [gpu], gpu_model: H100, gpu_count: 8}\n")
    after = topo("hosts:\n  g1: {groups: [gpu], gpu_model: H100, gpu_count: 4}\n")
    assert not changes_in_place(before, after)


def test_another_bridge_or_subnet_takes_the_lab_down_first():
    assert not changes_in_place(for_lab_name(load_topology(), "one"), load_topology())


def test_an_address_handed_from_a_removed_host_to_an_added_one_takes_the_lab_down_first():
    before = topo("hosts:\n  g1: {groups: [gpu], gpu_model: H100, gpu_count: 8}\n")
    after = topo("hosts:\n  g2: {groups: [gpu], gpu_model: H100, gpu_count: 8}\n")
    assert before.hosts[0].address == after.hosts[0].address
    assert not changes_in_place(before, after)
