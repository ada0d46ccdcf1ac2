"""--limit patterns select hosts as Ansible does; bad or empty patterns are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.hostpattern import NoHostsMatched, select, split_patterns
from deployer.inventory import load_inventory
from deployer.secrets import SecretValues

INVENTORY = """
all:
  hosts:
    bastion:
  children:
    gpu:
      hosts:
        gpu[01:04]:
    monitoring:
      children:
        prometheus:
          hosts:
            prom01:
            prom02:
        alertmanager:
          hosts:
            prom01:
            prom02:
            mon01:
        thanos_query:
    rack1:
      hosts:
        gpu01:
        gpu02:
        prom01:
"""


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("inv") / "hosts.yml"
    path.write_text(INVENTORY)
    return load_inventory(path, secrets=SecretValues())


def names(inventory, limit: str | None) -> list[str]:
    return [h.name for h in select(inventory, limit)]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, ["bastion", "gpu01", "gpu02", "gpu03", "gpu04", "prom01", "prom02", "mon01"]),
        ("all", ["bastion", "gpu01", "gpu02", "gpu03", "gpu04", "prom01", "prom02", "mon01"]),
        ("*", ["bastion", "gpu01", "gpu02", "gpu03", "gpu04", "prom01", "prom02", "mon01"]),
        ("gpu02", ["gpu02"]),
        ("gpu", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("monitoring", ["prom01", "prom02", "mon01"]),
        ("ungrouped", ["bastion"]),
        ("prom*", ["prom01", "prom02"]),
        ("gpu0[!24]", ["gpu01", "gpu03"]),  # "gpu0[13]" would be a subscript, as in Ansible
        ("gpu0?", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("~gpu0[2-3]", ["gpu02", "gpu03"]),
        ("~(prom|mon)0[12]", ["prom01", "prom02", "mon01"]),
        ("gpu,prometheus", ["gpu01", "gpu02", "gpu03", "gpu04", "prom01", "prom02"]),
        ("prometheus,gpu01", ["prom01", "prom02", "gpu01"]),
        ("gpu:prometheus", ["gpu01", "gpu02", "gpu03", "gpu04", "prom01", "prom02"]),
        ("gpu,!gpu03", ["gpu01", "gpu02", "gpu04"]),
        ("!gpu03,gpu", ["gpu01", "gpu02", "gpu04"]),
        ("gpu:!rack1", ["gpu03", "gpu04"]),
        ("rack1:&gpu", ["gpu01", "gpu02"]),
        ("&rack1,gpu,monitoring", ["gpu01", "gpu02", "prom01"]),
        ("monitoring:&alertmanager:!prom02", ["prom01", "mon01"]),
        ("!gpu", ["bastion", "prom01", "prom02", "mon01"]),
        ("&rack1", ["gpu01", "gpu02", "prom01"]),
        ("gpu[0]", ["gpu01"]),
        ("gpu[-1]", ["gpu04"]),
        ("gpu[1:2]", ["gpu02", "gpu03"]),
        ("gpu[2:]", ["gpu03", "gpu04"]),
        ("gpu01, prom01 ,", ["gpu01", "prom01"]),
        ("prometheus,thanos_query", ["prom01", "prom02"]),
    ],
)
def test_limit_selects_hosts_as_ansible_does(inventory, limit: str | None, expected: list) -> None:
    assert names(inventory, limit) == expected


def test_a_name_that_is_both_host_and_group_means_the_host(tmp_path: Path) -> None:
    path = tmp_path / "h.yml"
    path.write_text("gpu01:\n  hosts:\n    gpu02:\ngpu:\n  hosts:\n    gpu01:\n")
    assert names(load_inventory(path, secrets=SecretValues()), "gpu01") == ["gpu01"]


def test_limit_file_lists_one_pattern_per_line(inventory, tmp_path: Path) -> None:
    retry = tmp_path / "retry"
    retry.write_text("# failed last time\ngpu03\nprom02\n")
    assert names(inventory, f"@{retry}") == ["gpu03", "prom02"]


@pytest.mark.parametrize(
    ("limit", "key", "words"),
    [
        ("gpu05", "gpu05", "matches no host or group"),
        ("gpu,!gpu05", "!gpu05", "matches no host or group"),
        ("gpu,&storage", "&storage", "matches no host or group"),
        ("nosuch*", "nosuch*", "matches no host or group"),
        ("~gpu[", "~gpu[", "unbalanced"),
        ("gpu01,~gpu[", "~gpu[", "invalid host pattern"),
        ("gpu,!", "!", "without a pattern"),
        ("&", "&", "without a pattern"),
        ("", "", "empty limit"),
        (" , ", " , ", "empty limit"),
        ("gpu[7]", "gpu[7]", "out of range"),
        ("gpu[5:6]", "gpu[5:6]", "selects nothing"),
        ("gpu:!gpu", "gpu:!gpu", "selects no hosts"),
        ("thanos_query", "thanos_query", "selects no hosts"),
        ("@/nonexistent/retry-file", "@/nonexistent/retry-file", "cannot read limit file"),
    ],
)
def test_bad_or_empty_limit_is_refused_naming_the_pattern(
    inventory, limit: str, key: str, words: str
) -> None:
    with pytest.raises(InputError) as caught:
        select(inventory, limit)
    assert caught.value.key == key
    assert words in caught.value.message


def test_a_pattern_naming_nothing_is_distinguishable_from_a_malformed_one(inventory) -> None:
    with pytest.raises(NoHostsMatched):
        select(inventory, "storage")
    with pytest.raises(InputError) as caught:
        select(inventory, "gpu01,~gpu[")
    assert not isinstance(caught.value, NoHostsMatched)


@pytest.mark.parametrize(
    ("limit", "patterns"),
    [
        ("a,b", ["a", "b"]),
        ("a:b:!c", ["a", "b", "!c"]),
        ("gpu[0:1]", ["gpu[0:1]"]),
        ("gpu[0:1]:prom", ["gpu[0:1]", "prom"]),
        ("a:b,c", ["a:b", "c"]),
    ],
)
def test_limit_is_split_on_commas_else_on_colons_outside_brackets(limit: str, patterns) -> None:
    assert split_patterns(limit) == patterns


# -- the group's order, as Ansible's Group.get_hosts gives it (issue 14, 1.2)

REORDERED = "n1\nn2\nn3\n[g]\nn2\nn1\nn3\n"


def load_text(tmp_path: Path, text: str, name: str = "hosts"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_inventory(path, secrets=SecretValues())


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("g[0]", ["n2"]), ("g[-1]", ["n3"]), ("g[1:]", ["n1", "n3"]), ("g[0:1]", ["n2", "n1"])],
)
def test_a_subscript_picks_in_the_groups_order_not_the_files(
    tmp_path: Path, limit: str, expected: list[str]
) -> None:
    # ansible all -i hosts --list-hosts --limit 'g[0]' lists n2 (ansible-core 2.19.14)
    assert names(load_text(tmp_path, REORDERED), limit) == expected


def test_a_group_lists_its_own_hosts_then_its_childrens_breadth_first(tmp_path: Path) -> None:
    inv = load_text(
        tmp_path,
        "all:\n  children:\n    a:\n      children:\n        a1:\n          hosts:\n"
        "            deep1:\n        a2:\n          hosts:\n            deep2:\n"
        "      hosts:\n        mid1:\n    b:\n      hosts:\n        mid2:\n        deep1:\n",
        "hosts.yml",
    )
    assert names(inv, "a") == ["mid1", "deep1", "deep2"]
    assert names(inv, None) == ["mid1", "mid2", "deep1", "deep2"]  # all: a, b, then a1, a2


def test_a_glob_subscript_picks_from_every_matched_groups_hosts_in_turn(tmp_path: Path) -> None:
    inv = load_text(tmp_path, "[g1]\nx\ny\n[g2]\ny\nz\n")
    # Ansible's _enumerate_matches: g1's hosts, then g2's, repeats kept until the end.
    assert names(inv, "g*[2]") == ["y"]
    assert names(inv, "g*[3]") == ["z"]


def test_a_limit_leaves_the_hosts_of_all_in_alls_order(tmp_path: Path) -> None:
    from deployer.hostpattern import select_limit

    inv = load_text(tmp_path, REORDERED)
    assert names(inv, "n3,g[0]") == ["n3", "n2"]  # the pattern's order (a play's hosts)
    assert [h.name for h in select_limit(inv, "n3,g[0]")] == ["n2", "n3"]  # --limit: all's


def test_the_removed_dash_subscript_is_refused_naming_the_colon_form(inventory) -> None:
    with pytest.raises(InputError, match=r"write \[1:2\]"):
        select(inventory, "gpu[1-2]")


# -- IPv6 host names in patterns (issue 14, 1.3)

IPV6 = "fe80::1610:9fff:fedd:654b\n[v6]\n2001:db8::1\n2001:db8::2\n[2001:db8::3]:2200\n"


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("fe80::1610:9fff:fedd:654b", ["fe80::1610:9fff:fedd:654b"]),
        ("2001:db8::1,2001:db8::3", ["2001:db8::1", "2001:db8::3"]),
        ("v6,!2001:db8::2", ["2001:db8::1", "2001:db8::3"]),
        # Not one address: split on ':' as Ansible splits it, unless a comma says otherwise.
        ("~2001:db8::[12],", ["2001:db8::1", "2001:db8::2"]),
    ],
)
def test_an_ipv6_host_name_is_one_pattern(tmp_path: Path, limit: str, expected: list) -> None:
    assert names(load_text(tmp_path, IPV6), limit) == expected


def test_a_limit_that_is_one_address_is_not_split_on_its_colons() -> None:
    assert split_patterns("fe80::1610:9fff:fedd:654b") == ["fe80::1610:9fff:fedd:654b"]
    assert split_patterns("[2001:db8::3]:2200") == ["[2001:db8::3]:2200"]
    assert split_patterns("gpu:prom") == ["gpu", "prom"]


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        # the product's site names groups an inventory may lack: the others still apply
        ("monitoring:prometheus:alertmanager:thanos_query:grafana", ["prom01", "prom02", "mon01"]),
        ("no_such_group", []),
        ("gpu:!no_such_group", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("gpu:&no_such_group", []),
    ],
)
def test_a_play_ignores_a_group_the_inventory_lacks_as_ansible_playbook_does(
    inventory, hosts: str, expected: list[str]
) -> None:
    # ansible-playbook warns "Could not match supplied host pattern, ignoring" and goes on
    assert [h.name for h in select(inventory, hosts, play=True)] == expected


def test_a_limit_naming_a_group_the_inventory_lacks_is_still_refused(inventory) -> None:
    with pytest.raises(NoHostsMatched):
        select(inventory, "gpu:no_such_group")
