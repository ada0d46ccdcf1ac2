"""A ``hostvars`` entry is a view over the inventory's layers, not a merged copy: it must read
exactly as the merged variables (deployer/plan.py ``resolve``) do, values and order."""

from __future__ import annotations

from pathlib import Path

from deployer.inventory import load_inventory
from deployer.inventory.model import LayeredVars
from deployer.plan import LazyHostVars, resolve
from deployer.templating import Renderer, make_environment

INVENTORY = """
all:
  vars:
    site: lab
  children:
    gpu:
      vars:
        gpu_model: H100
        port: 9400
      hosts:
        gpu01: {ansible_host: 10.0.0.1, port: 9500, rack: r1}
        gpu02: {ansible_host: 10.0.0.2}
"""


def _inventory(tmp_path: Path):
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    return load_inventory(path)


def test_layered_vars_read_as_the_merged_dict_in_its_order():
    low, mid, high = {"a": 1, "b": 2}, {"b": 3, "c": 4}, {"d": 5, "a": 6}
    view = LayeredVars(high, mid, low)
    merged = {**low, **mid, **high}
    assert list(view) == list(merged)
    assert dict(view) == merged
    assert len(view) == len(merged)
    assert "c" in view and "z" not in view
    assert view.get("z", "none") == "none"
    keys = ("a", "b", "z", "c", "d")
    assert view.get_many(keys, "none") == tuple(view.get(k, "none") for k in keys)


def test_many_variables_read_at_once_are_each_one_read_alone_magic_ones_included(tmp_path):
    inventory = _inventory(tmp_path)
    defaults = {"port": 1, "role_default": "x"}
    keys = ("port", "rack", "role_default", "inventory_hostname", "group_names", "missing")
    for overrides in ({}, {"rack": "r9"}, {"rack": "r9", "inventory_hostname": "over"}):
        for host in ("gpu01", "gpu02"):
            view = inventory.layered_vars(host, defaults, overrides)
            assert view.get_many(keys) == tuple(view.get(k) for k in keys)
            assert view.get_many(keys, 0)[-1] == 0


def test_a_hostvars_entry_holds_what_resolve_gives_with_its_own_name_and_hostvars(tmp_path):
    inventory = _inventory(tmp_path)
    defaults = {"port": 1, "role_default": "x", "site": "default"}
    overrides = {"rack": "r9", "hostvars": "not this", "inventory_hostname": "nor this"}
    hostvars = LazyHostVars(inventory, defaults, Renderer(make_environment()), overrides)
    for host in ("gpu01", "gpu02"):
        expected = resolve(inventory, host, defaults, overrides)
        expected.update(inventory_hostname=host, hostvars=hostvars)
        entry = hostvars[host]
        assert list(entry) == list(expected)
        assert {k: entry[k] for k in entry} == expected
        assert entry.get("missing", 0) == 0


def test_a_hosts_values_read_without_its_entry_are_what_its_entry_gives(tmp_path, monkeypatch):
    from deployer.templating import TemplatedVars

    inventory = _inventory(tmp_path)
    defaults = {"port": 1, "role_default": "x", "site": "default", "label": "{{ site }}-{{ port }}"}
    overrides = {"rack": "r9", "inventory_hostname": "not this"}
    reads = ("port", "role_default", "site", "rack", "missing", "gpu_model")
    for over in ({}, overrides):
        entries = LazyHostVars(inventory, defaults, Renderer(make_environment()), over)
        fast = LazyHostVars(inventory, defaults, Renderer(make_environment()), over)
        for host in ("gpu01", "gpu02"):
            entry = entries[host]
            assert fast.values_of(host, reads) == tuple(entry.get(k) for k in reads)
            # a template, or a magic variable, is read through the entry, rendered
            assert fast.values_of(host, ("label", "inventory_hostname")) == (
                entry["label"],
                host,
            )
    built: list[str] = []
    real_init = TemplatedVars.__init__

    def init(self, raw, renderer, source="variables"):
        built.append(source)
        real_init(self, raw, renderer, source)

    monkeypatch.setattr(TemplatedVars, "__init__", init)
    hostvars = LazyHostVars(inventory, defaults, Renderer(make_environment()), overrides)
    hostvars.values_of("gpu01", ("port",))  # the first builds its entry (the defaults' secrets)
    assert hostvars.values_of("gpu02", ("port", "rack", "site")) == (9400, "r9", "lab")
    assert built == ["variables of gpu01"]
    assert hostvars.values_of("gpu02", ("label",)) == ("lab-9400",)
    assert built == ["variables of gpu01", "variables of gpu02"]


def test_the_magic_variables_win_over_the_inventory_and_lose_only_to_overrides(tmp_path):
    inventory = _inventory(tmp_path)
    host = inventory.host("gpu01")
    defaults = {"group_names": "a default", "port": 1}
    plain = inventory.layered_vars(host, defaults)
    assert plain["group_names"] == host.group_names and plain.get("inventory_hostname") == "gpu01"
    assert "hostvars" in plain and list(plain) == list(inventory.resolve_vars(host, defaults))
    disjoint = inventory.layered_vars(host, defaults, {"port": 2})
    assert disjoint["port"] == 2 and disjoint["group_names"] == host.group_names
    assert list(disjoint) == list({**inventory.resolve_vars(host, defaults), "port": 2})
    naming_one = inventory.layered_vars(host, defaults, {"group_names": ["mine"]})
    assert naming_one["group_names"] == ["mine"] and naming_one.get("group_names") == ["mine"]


def test_the_groups_a_play_sees_are_read_as_they_are_never_scanned_for_templates(
    tmp_path, monkeypatch
):
    from deployer import templating
    from deployer.plan import Planner
    from deployer.roles import Play

    inventory = _inventory(tmp_path)
    planner = Planner(inventory, [Path(__file__).resolve().parents[2] / "roles"], None)
    scope = planner.host_vars("gpu01", Play(name="p", hosts="all", roles=()))
    scanned = []
    original = templating._has_template
    monkeypatch.setattr(
        templating, "_has_template", lambda value: scanned.append(value) or original(value)
    )
    groups = scope["groups"]
    assert isinstance(groups, templating.NamesOnly) and scanned == []
    assert groups["all"] == inventory.group_hosts("all")
