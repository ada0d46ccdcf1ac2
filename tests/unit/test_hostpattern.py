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
