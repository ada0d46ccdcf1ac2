"""TOML inventories read as Ansible's toml inventory plugin reads them (issue 14, 1.8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.inventory import load_inventory
from deployer.secrets import SecretValues

# The shape of Ansible's own example (lib/ansible/plugins/inventory/toml.py, EXAMPLES).
SAMPLE = """\
[all.vars]
has_java = false

[web]
children = ["apache", "nginx"]
vars = { http_port = 8080, myvar = 23 }

[web.hosts]
host1 = {}
host2 = { ansible_port = 222 }

[apache.hosts]
tomcat1 = {}
tomcat2 = { myvar = 34 }

[nginx.hosts.jenkins1]

[nginx.vars]
has_java = true

[ungrouped.hosts]
lonely = { ansible_host = "127.0.0.1", ansible_port = 45 }
"""


def load(tmp_path: Path, text: str, name: str = "hosts.toml"):
    (tmp_path / name).write_text(text)
    return load_inventory(tmp_path / name, secrets=SecretValues())


def test_a_toml_inventory_has_groups_hosts_children_and_vars(tmp_path: Path) -> None:
    inv = load(tmp_path, SAMPLE)
    assert inv.groups["web"].children == ["apache", "nginx"]
    assert inv.group_hosts("web") == ["host1", "host2", "tomcat1", "tomcat2", "jenkins1"]
    assert inv.group_hosts("ungrouped") == ["lonely"]
    assert inv.host("tomcat2").vars == {"has_java": False, "http_port": 8080, "myvar": 34}
    assert inv.host("jenkins1").vars["has_java"] is True


def test_toml_host_variables_set_the_connection(tmp_path: Path) -> None:
    inv = load(tmp_path, SAMPLE)
    assert inv.connection("host2").port == 222
    lonely = inv.connection("lonely")
    assert (lonely.address, lonely.port) == ("127.0.0.1", 45)


def test_toml_host_ranges_and_ports_read_as_in_the_other_formats(tmp_path: Path) -> None:
    inv = load(tmp_path, '[gpu.hosts]\n"gpu[01:03]" = {}\n"prom01:2200" = {}\n')
    assert inv.group_hosts("gpu") == ["gpu01", "gpu02", "gpu03", "prom01"]
    assert inv.connection("prom01").port == 2200


def test_toml_values_keep_their_types(tmp_path: Path) -> None:
    inv = load(tmp_path, "[g.hosts.h1]\nn = 8\nratio = 0.5\nwhen = 1979-05-27T07:32:00Z\n")
    shown = inv.to_dict(host="h1")["vars"]
    assert shown == {"n": 8, "ratio": 0.5, "when": "1979-05-27T07:32:00+00:00"}


def test_invalid_toml_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(InputError) as refused:
        load(tmp_path, "[g]\nhosts = { a = {} }\nbroken = = 1\n")
    assert refused.value.source == str(tmp_path / "hosts.toml")
    assert refused.value.line == 3
    assert "invalid TOML" in refused.value.message


def test_a_toml_inventory_is_not_read_as_ini(tmp_path: Path) -> None:
    # It was: "expected key=value host variable" on the first table.
    inv = load(tmp_path, '[all.vars]\nregion = "eu"\n[g.hosts.h1]\n')
    assert inv.host("h1").vars == {"region": "eu"}


@pytest.mark.parametrize(
    ("text", "words", "line"),
    [
        ("[g]\ncolour = 1\n", "unknown key 'colour' in group 'g'", 2),
        ("[g]\nchildren = 'a'\n", "g.children must be a list of group names", 2),
        ("[g]\nhosts = ['a']\n", "g.hosts must be a table", 2),
        ("[g.hosts]\nh1 = 3\n", "g.hosts.h1 must be a table", 2),
        ('plugin = "constructed"\n', "inventory plugin configuration is not supported", 1),
        ("[g.hosts.h1]\n2bad = 1\n", "invalid variable name '2bad'", 2),
    ],
)
def test_a_bad_toml_inventory_is_refused_naming_the_key_and_line(
    tmp_path: Path, text: str, words: str, line: int
) -> None:
    with pytest.raises(InputError) as refused:
        load(tmp_path, text)
    assert words in str(refused.value)
    assert refused.value.line == line
