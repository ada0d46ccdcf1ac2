"""Variable precedence, one row per layer: the highest layer that sets a variable wins.

role defaults < inventory group vars (all, then parents before children) < group_vars/ files (all,
then parents before children) < inventory host vars < host_vars/ < extra vars. In the fixture,
``upto_<layer>`` is set in <layer> and every layer below it, always to the setting layer's name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.inventory import load_inventory, parse_extra_vars
from deployer.secrets import SecretValues

FIXTURES = Path(__file__).parent.parent / "fixtures" / "inventories"

LAYERS = [
    "role_default",
    "inventory_all",
    "inventory_parent",
    "inventory_child",
    "group_vars_all",
    "group_vars_parent",
    "group_vars_child",
    "inventory_host",
    "host_vars",
    "extra_vars",
]


@pytest.fixture(scope="module")
def resolved() -> dict:
    inv = load_inventory(
        FIXTURES / "precedence", {"upto_extra_vars": "extra_vars"}, secrets=SecretValues()
    )
    defaults = {f"upto_{layer}": "role_default" for layer in LAYERS}
    return inv.resolve_vars("prom01", defaults)


@pytest.mark.parametrize("layer", LAYERS)
def test_the_highest_layer_setting_a_variable_wins(resolved: dict, layer: str) -> None:
    assert resolved[f"upto_{layer}"] == layer


def test_host_vars_exclude_role_defaults() -> None:
    inv = load_inventory(FIXTURES / "precedence", secrets=SecretValues())
    assert "upto_role_default" not in inv.host("prom01").vars


def test_origins_name_the_file_and_line_of_the_winning_value() -> None:
    inv = load_inventory(FIXTURES / "precedence", secrets=SecretValues())
    origins = inv.host("prom01").origins
    assert origins["upto_group_vars_all"] == str(FIXTURES / "precedence/group_vars/all.yml") + ":3"
    assert origins["upto_inventory_child"].startswith(str(FIXTURES / "precedence/hosts.yml:"))


def test_every_variable_has_one_origin_and_extra_vars_and_host_vars_win_theirs() -> None:
    inv = load_inventory(
        FIXTURES / "precedence", {"upto_group_vars_all": 1, "new": 2}, secrets=SecretValues()
    )
    host = inv.host("prom01")
    assert list(host.origins) == list(host.vars)
    assert host.origins["upto_group_vars_all"] == host.origins["new"] == "-e"
    plain = load_inventory(FIXTURES / "precedence", secrets=SecretValues()).host("prom01")
    assert list(plain.origins) == list(plain.vars)
    own = [k for k, where in plain.origins.items() if "host_vars" in where]
    assert own and all(inv.host("prom01").origins[k] == plain.origins[k] for k in own)


def test_sibling_groups_of_equal_depth_merge_by_name_so_the_later_name_wins() -> None:
    inv = load_inventory(FIXTURES / "siblings" / "hosts.yml", secrets=SecretValues())
    assert inv.host("gpu01").vars["rack"] == "from-zeta"


def test_ansible_group_priority_overrides_the_name_order() -> None:
    inv = load_inventory(FIXTURES / "siblings" / "priority.yml", secrets=SecretValues())
    assert inv.host("gpu01").vars["rack"] == "from-alpha"


def test_a_later_layer_replaces_a_mapping_whole(tmp_path: Path) -> None:
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "gpu01.yml").write_text("labels: {rack: r2}\n")
    (tmp_path / "h.yml").write_text(
        "gpu:\n  vars:\n    labels: {rack: r1, row: a}\n  hosts:\n    gpu01:\n"
    )
    inv = load_inventory(tmp_path / "h.yml", secrets=SecretValues())
    assert inv.host("gpu01").vars["labels"] == {"rack": "r2"}


def test_later_extra_vars_items_override_earlier_ones() -> None:
    assert parse_extra_vars(["a=1 b=2", "b=3"]) == {"a": "1", "b": "3"}


def test_ansible_group_priority_is_the_groups_property_not_a_variable() -> None:
    # Ansible's Group.set_variable takes it as the priority and keeps no variable of it.
    inv = load_inventory(FIXTURES / "siblings" / "priority.yml", secrets=SecretValues())
    assert inv.groups["alpha"].priority == 10
    assert "ansible_group_priority" not in inv.host("gpu01").vars
    assert "ansible_group_priority" not in inv.to_dict()["groups"]["alpha"]["vars"]


def test_ansible_group_priority_may_be_written_as_a_string_of_an_integer(tmp_path: Path) -> None:
    (tmp_path / "h.ini").write_text(
        "[zeta]\ngpu01\n[zeta:vars]\nrack=z\n[alpha]\ngpu01\n"
        "[alpha:vars]\nrack=a\nansible_group_priority='10'\n"
    )
    inv = load_inventory(tmp_path / "h.ini", secrets=SecretValues())
    assert inv.host("gpu01").vars["rack"] == "a"
