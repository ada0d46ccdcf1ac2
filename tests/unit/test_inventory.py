"""Inventories load as Ansible loads them: groups, ranges, INI typing, files and directories."""

from __future__ import annotations

import gc
import getpass
import json
from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.inventory import expand_host_range, load_inventory
from deployer.secrets import MASK, SecretValues

FIXTURES = Path(__file__).parent.parent / "fixtures" / "inventories"
EQUIVALENT = FIXTURES / "equivalent"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load(path: Path, extra: dict | None = None):
    return load_inventory(path, extra, secrets=SecretValues())


# -- structure


def test_hosts_are_in_the_order_they_are_first_defined() -> None:
    inv = load(EQUIVALENT / "hosts.yml")
    assert list(inv.hosts) == ["bastion", "gpu01", "gpu02", "gpu03", "prom01", "prom02", "mon01"]


def test_children_nest_groups_and_a_group_holds_its_descendants_hosts() -> None:
    inv = load(EQUIVALENT / "hosts.yml")
    assert inv.groups["monitoring"].children == ["prometheus", "alertmanager"]
    assert inv.group_hosts("monitoring") == ["prom01", "prom02", "mon01"]


def test_every_group_without_a_parent_is_a_child_of_all() -> None:
    inv = load(EQUIVALENT / "hosts.yml")
    assert set(inv.groups["all"].children) == {"ungrouped", "gpu", "monitoring"}
    assert inv.group_hosts("all") == list(inv.hosts)


def test_a_host_in_no_group_is_in_ungrouped() -> None:
    inv = load(EQUIVALENT / "hosts.yml")
    assert inv.group_hosts("ungrouped") == ["bastion"]
    assert inv.host("bastion").group_names == ["ungrouped"]


def test_a_host_under_all_and_a_group_is_not_ungrouped(tmp_path: Path) -> None:
    inv = load(
        write(tmp_path / "h.yml", "all:\n  hosts:\n    gpu01:\ngpu:\n  hosts:\n    gpu01:\n")
    )
    assert inv.group_hosts("ungrouped") == []
    assert inv.host("gpu01").group_names == ["gpu"]


def test_a_host_listed_twice_in_a_group_is_one_member_in_its_first_place(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.ini", "[gpu]\ngpu01\ngpu02\n[gpu]\ngpu03\ngpu01\n"))
    assert inv.groups["gpu"].hosts == ["gpu01", "gpu02", "gpu03"]
    assert inv.host("gpu01").group_names == ["gpu"]


def test_hosts_under_all_and_a_group_leave_ungrouped_and_the_rest_keep_their_order(
    tmp_path: Path,
) -> None:
    text = "all:\n  hosts:\n    a1:\n    g1:\n    a2:\n    g2:\n    a3:\ngpu:\n  hosts:\n    g2:\n    g1:\n"
    inv = load(write(tmp_path / "h.yml", text))
    assert inv.group_hosts("ungrouped") == ["a1", "a2", "a3"]
    assert inv.group_hosts("gpu") == ["g2", "g1"]
    assert inv.group_hosts("all") == ["a1", "g1", "a2", "g2", "a3"]


def test_host_groups_include_ancestors_in_merge_order() -> None:
    inv = load(EQUIVALENT / "hosts.yml")
    assert inv.host("prom01").groups == ("all", "monitoring", "alertmanager", "prometheus")


def test_yaml_children_may_define_a_group_that_has_no_hosts(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.yml", "monitoring:\n  children:\n    thanos_query:\n"))
    assert inv.group_hosts("thanos_query") == []


def test_a_group_may_be_defined_in_two_places_and_is_merged(tmp_path: Path) -> None:
    text = (
        "gpu:\n  hosts:\n    gpu01:\nrack1:\n  children:\n    gpu:\n      hosts:\n        gpu02:\n"
    )
    inv = load(write(tmp_path / "h.yml", text))
    assert inv.group_hosts("gpu") == ["gpu01", "gpu02"]
    assert inv.group_hosts("rack1") == ["gpu01", "gpu02"]


def test_yaml_hosts_may_be_a_single_name(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.yml", "gpu:\n  hosts: gpu01\n"))
    assert inv.group_hosts("gpu") == ["gpu01"]


def test_a_host_and_a_group_with_the_same_name_is_a_warning(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.yml", "gpu01:\n  hosts:\n    gpu01:\n"))
    assert any("both a host and a group" in w for w in inv.warnings)


# -- ranges and ports


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu[01:04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("gpu[1:3]", ["gpu1", "gpu2", "gpu3"]),
        ("gpu[8:11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[01:07:3]", ["gpu01", "gpu04", "gpu07"]),
        ("node-[a:c]", ["node-a", "node-b", "node-c"]),
        ("r[1:2]-gpu[a:b].lab", ["r1-gpua.lab", "r1-gpub.lab", "r2-gpua.lab", "r2-gpub.lab"]),
        ("gpu[:2]", ["gpu0", "gpu1", "gpu2"]),
        ("plain", ["plain"]),
    ],
)
def test_host_ranges_expand_as_ansible_expands_them(pattern: str, expected: list[str]) -> None:
    assert expand_host_range(pattern) == expected


@pytest.mark.parametrize("pattern", ["gpu[4:1]", "gpu[1]", "gpu[1:2:3:4]", "gpu[1:]", "gpu[a:3]"])
def test_malformed_host_ranges_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        expand_host_range(pattern)


def test_a_range_in_an_inventory_defines_each_host_with_its_variables(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.yml", "gpu:\n  hosts:\n    gpu[01:03]:\n      rack: r1\n"))
    assert list(inv.hosts) == ["gpu01", "gpu02", "gpu03"]
    assert all(h.vars["rack"] == "r1" for h in inv.hosts.values())


def test_name_colon_port_sets_ansible_port(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.ini", "[gpu]\ngpu[01:02]:2222\n"))
    assert inv.host("gpu02").vars["ansible_port"] == 2222
    assert inv.connection("gpu02").port == 2222


def test_ipv6_address_is_a_host_name_not_a_port(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.ini", "[gpu]\nfd00::1\n[fd00::2]:2200\n"))
    assert list(inv.hosts) == ["fd00::1", "fd00::2"]
    assert inv.connection("fd00::2").port == 2200


# -- INI


def test_ini_and_yaml_forms_of_the_same_inventory_load_identically() -> None:
    yaml_view = load(EQUIVALENT / "hosts.yml").to_dict(mask_secrets=False)
    ini_view = load(EQUIVALENT / "hosts.ini").to_dict(mask_secrets=False)
    assert ini_view == yaml_view


@pytest.mark.parametrize(
    ("ini_value", "expected"),
    [
        ("8", 8),
        ("1.5", 1.5),
        ("True", True),
        ("False", False),
        ("None", None),
        ("true", "true"),  # Ansible: not a Python literal, so a string
        ("yes", "yes"),
        ('"580"', "580"),
        ("[1, 2]", [1, 2]),
        ("(1, 2)", [1, 2]),
        ("{'a': 1}", {"a": 1}),
        ("H100", "H100"),
        ("580.65.06", "580.65.06"),
        ("'03#pa33'", "03#pa33"),
    ],
)
def test_ini_values_are_typed_as_python_literals_like_ansible(
    tmp_path: Path, ini_value: str, expected: object
) -> None:
    inv = load(write(tmp_path / "h.ini", f"[gpu]\ngpu01\n\n[gpu:vars]\nv={ini_value}\n"))
    assert inv.host("gpu01").vars["v"] == expected


def test_ini_host_line_values_are_typed_and_may_be_quoted(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "h.ini", '[gpu]\ngpu01 gpu_count=8 note="two words" # comment\n'))
    assert inv.host("gpu01").vars == {"gpu_count": 8, "note": "two words"}


def test_ini_hosts_before_any_section_are_ungrouped(tmp_path: Path) -> None:
    inv = load(write(tmp_path / "hosts", "bastion\n\n[gpu]\ngpu01\n"))
    assert inv.group_hosts("ungrouped") == ["bastion"]


def test_ini_children_may_be_declared_after_they_are_named(tmp_path: Path) -> None:
    text = "[monitoring:children]\nprometheus\n\n[prometheus]\nprom01\n"
    inv = load(write(tmp_path / "h.ini", text))
    assert inv.group_hosts("monitoring") == ["prom01"]


def test_file_without_extension_is_detected_as_yaml_or_ini(tmp_path: Path) -> None:
    yaml_inv = load(write(tmp_path / "a" / "hosts", "gpu:\n  hosts:\n    gpu01:\n"))
    ini_inv = load(write(tmp_path / "b" / "hosts", "[gpu]\ngpu01\n"))
    assert yaml_inv.group_hosts("gpu") == ini_inv.group_hosts("gpu") == ["gpu01"]


# -- directories and vars files


def test_directory_inventory_reads_every_file_in_name_order() -> None:
    inv = load(FIXTURES / "directory")
    assert list(inv.hosts) == ["gpu01", "gpu02", "gpu03", "gpu04", "prom01", "prom02"]
    assert inv.groups["monitoring"].children == ["prometheus", "gpu"]
    assert inv.sources == [
        str(FIXTURES / "directory" / "10-gpu.yml"),
        str(FIXTURES / "directory" / "20-monitoring.ini"),
    ]


def test_group_vars_directory_files_apply_in_name_order() -> None:
    inv = load(FIXTURES / "directory")
    assert inv.host("gpu01").vars["gpu_count"] == 4  # 20-override.yaml over 10-hardware.yml
    assert inv.host("gpu01").vars["gpu_model"] == "H100"
    assert inv.host("gpu01").origins["gpu_count"].endswith("group_vars/gpu/20-override.yaml:1")


def test_vars_file_without_extension_and_json_host_vars_are_read() -> None:
    inv = load(FIXTURES / "directory")
    assert inv.host("prom01").vars["cluster"] == "lab"
    assert inv.host("gpu02").vars["gpu_model"] == "H200"


def test_group_vars_for_a_group_not_in_the_inventory_is_a_warning() -> None:
    inv = load(FIXTURES / "directory")
    assert any("no group 'storage'" in w for w in inv.warnings)
    assert "nfs_server" not in inv.host("gpu01").vars


def test_a_host_ssh_reaches_at_ansible_ssh_host_but_the_monitoring_tier_would_not_is_warned(
    tmp_path: Path,
) -> None:
    # SSH goes to ansible_ssh_host (it wins, as in ansible-core); targets and peers read
    # ansible_host, else the name, as Ansible roles write them.
    inv = load(
        write(
            tmp_path / "hosts.yml",
            "gpu:\n  hosts:\n"
            "    old01: {ansible_ssh_host: 10.0.0.1}\n"
            "    both02: {ansible_ssh_host: 10.0.0.2, ansible_host: 10.0.0.2}\n"
            "    mgmt03: {ansible_ssh_host: 10.9.0.3, ansible_host: 10.0.0.3}\n"
            "    plain04: {ansible_host: 10.0.0.4}\n",
        )
    )
    assert inv.connection("old01").address == "10.0.0.1"
    [warning] = [w for w in inv.warnings if "ansible_ssh_host" in w]
    assert "2 host(s)" in warning
    assert "old01: SSH to 10.0.0.1, the monitoring tier to old01" in warning
    assert "mgmt03: SSH to 10.9.0.3, the monitoring tier to 10.0.0.3" in warning
    assert "both02" not in warning and "plain04" not in warning


def test_ansibles_password_variables_are_warned_about_by_name_never_by_value(
    tmp_path: Path,
) -> None:
    # Keys only (a key file or the SSH agent) and `sudo -n`: none of them is read.
    write(tmp_path / "group_vars" / "lab.yml", "ansible_ssh_pass: hunter2-ssh\n")
    inv = load(
        write(
            tmp_path / "hosts.yml",
            "lab:\n  hosts:\n"
            "    l1: {}\n"
            "    l2: {ansible_ssh_pass: null}\n"  # set back to unset for this host
            "gpu:\n  hosts:\n"
            "    g1: {ansible_become: true, ansible_become_password: hunter2-sudo}\n"
            "    g2: {ansible_become_pass: hunter2-sudo}\n"  # does not become: nothing to say
            "    g3: {ansible_private_key_passphrase: hunter2-key}\n",
        )
    )
    said = [w for w in inv.warnings if "does not read" in w]
    assert len(said) == 3
    [password] = [w for w in said if "ansible_password" in w]
    [become] = [w for w in said if "ansible_become_password" in w]
    [passphrase] = [w for w in said if "passphrase" in w]
    assert password.startswith("1 host(s) set ansible_password / ansible_ssh_pass")
    assert "(l1)" in password and "SSH key" in password
    assert become.startswith("1 host(s) that become set ansible_become_password")
    assert "(g1)" in become and "passwordless sudo" in become
    assert "(g3)" in passphrase and "SSH agent" in passphrase
    assert not any("hunter2" in w for w in inv.warnings)


def test_group_vars_beside_an_inventory_file_are_read(tmp_path: Path) -> None:
    write(tmp_path / "group_vars" / "gpu.yml", "gpu_model: B200\n")
    inv = load(write(tmp_path / "hosts.yml", "gpu:\n  hosts:\n    gpu01:\n"))
    assert inv.host("gpu01").vars["gpu_model"] == "B200"


def test_an_empty_vars_file_defines_nothing(tmp_path: Path) -> None:
    write(tmp_path / "host_vars" / "gpu01.yml", "# nothing yet\n")
    inv = load(write(tmp_path / "hosts.yml", "gpu:\n  hosts:\n    gpu01:\n"))
    assert dict(inv.host("gpu01").vars) == {}


# -- connection settings


def test_connection_defaults_follow_ansible(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USER", "sre")
    monkeypatch.setenv("LOGNAME", "sre")
    inv = load(write(tmp_path / "h.yml", "gpu:\n  hosts:\n    gpu01:\n"))
    spec = inv.connection("gpu01")
    assert (spec.address, spec.port, spec.user) == ("gpu01", 22, "sre")
    assert (spec.become, spec.become_user, spec.private_key_file) == (False, "root", None)
    assert spec.known_hosts_file == str(tmp_path / ".ssh" / "known_hosts")
    assert spec.host_key_policy == "verify"


def test_connection_variables_are_read_with_their_ansible_names(tmp_path: Path) -> None:
    text = """gpu:
  hosts:
    gpu01:
      ansible_host: 10.0.0.21
      ansible_port: "2201"
      ansible_user: deploy
      ansible_ssh_private_key_file: /etc/gpumon/id_ed25519
      ansible_become: "yes"
      ansible_become_user: admin
      gpumon_known_hosts_file: /etc/gpumon/known_hosts
      gpumon_host_key_policy: accept-new
"""
    spec = load(write(tmp_path / "h.yml", text)).connection("gpu01")
    assert spec.address == "10.0.0.21"
    assert spec.port == 2201
    assert spec.user == "deploy"
    assert spec.private_key_file == "/etc/gpumon/id_ed25519"
    assert spec.become is True
    assert spec.become_user == "admin"
    assert spec.known_hosts_file == "/etc/gpumon/known_hosts"
    assert spec.host_key_policy == "accept-new"


def test_the_ansible_ssh_alias_wins_over_its_plain_name_from_any_layer(tmp_path: Path) -> None:
    """As ansible-core's ssh connection reads them (its vars: list each ansible_ssh_ alias
    after the plain name, the last set wins; tests/parity compares with ansible-core itself):
    the alias wins where both are set, even from a lower layer than the plain name."""
    text = """all:
  vars:
    ansible_ssh_port: 2200
    ansible_ssh_user: admin
  hosts:
    gpu01:
      ansible_host: 10.0.0.21
      ansible_ssh_host: 10.0.0.22
      ansible_port: 2201
      ansible_user: deploy
    gpu02:
      ansible_host: 10.0.0.23
"""
    inv = load(write(tmp_path / "h.yml", text))
    spec = inv.connection("gpu01")
    assert (spec.address, spec.port, spec.user) == ("10.0.0.22", 2200, "admin")
    assert inv.connection("gpu02").address == "10.0.0.23"


def test_connection_variables_may_be_templates(tmp_path: Path) -> None:
    text = 'gpu:\n  vars:\n    ansible_host: "{{ inventory_hostname }}.mgmt.{{ site }}"\n'
    text += "    site: lab\n  hosts:\n    gpu01:\n"
    assert load(write(tmp_path / "h.yml", text)).connection("gpu01").address == "gpu01.mgmt.lab"


@pytest.mark.parametrize("layer", ["group", "host", "group_vars", "host_vars", "extra"])
def test_a_connection_template_is_rendered_from_whichever_layer_sets_it(
    tmp_path: Path, layer: str
) -> None:
    """Only gpu01 has the template; gpu02 shares its groups and is read as written."""
    template = '"{{ inventory_hostname }}.mgmt"'
    group_line = f"    ansible_user: {template}\n" if layer == "group" else ""
    inline = f"ansible_user: {template}" if layer == "host" else ""
    text = (
        f"gpu:\n  vars:\n    site: lab\n{group_line}  hosts:\n"
        f"    gpu01: {{{inline}}}\n    gpu02: {{ansible_host: 10.0.0.2}}\n"
    )
    if layer == "group_vars":
        write(tmp_path / "group_vars" / "gpu.yml", f"ansible_user: {template}\n")
    if layer == "host_vars":
        write(tmp_path / "host_vars" / "gpu01.yml", f"ansible_user: {template}\n")
    extra = {"ansible_user": "{{ inventory_hostname }}.mgmt"} if layer == "extra" else None
    inv = load(write(tmp_path / "h.yml", text), extra)
    assert inv.connection("gpu01").user == "gpu01.mgmt"
    shared = layer in ("group", "group_vars", "extra")
    assert inv.connection("gpu02").user == ("gpu02.mgmt" if shared else getpass.getuser())


def test_undefined_variable_in_a_connection_template_is_refused(tmp_path: Path) -> None:
    text = 'gpu:\n  hosts:\n    gpu01:\n      ansible_host: "{{ mgmt_domain }}"\n'
    with pytest.raises(InputError, match="mgmt_domain") as caught:
        load(write(tmp_path / "h.yml", text))
    assert (caught.value.key, caught.value.line) == ("ansible_host", 4)


def test_a_become_method_other_than_sudo_is_refused_by_key_and_line(tmp_path: Path) -> None:
    """Become is ``sudo -n``: an inventory asking for su (or doas, pbrun...) is refused before
    any host is contacted, not run with sudo behind its back; unused (no become) it is left."""
    text = (
        "gpu:\n  vars:\n    ansible_become_method: su\n  hosts:\n"
        "    gpu01:\n      ansible_become: true\n    gpu02:\n"
    )
    with pytest.raises(InputError, match="become method 'su' is not supported") as caught:
        load(write(tmp_path / "h.yml", text))
    assert (caught.value.key, caught.value.line) == ("ansible_become_method", 3)
    quiet = load(write(tmp_path / "q.yml", text.replace("ansible_become: true", "x: 1")))
    assert quiet.connection("gpu01").become is False
    sudo = load(write(tmp_path / "s.yml", text.replace(": su", ": sudo")))
    assert sudo.connection("gpu01").become is True


def test_hosts_sharing_their_connection_settings_each_get_their_own_address(
    tmp_path: Path,
) -> None:
    from deployer.inventory.connection_vars import connection_spec

    text = """gpu:
  vars: {ansible_user: deploy, ansible_port: 2222, ansible_become: true}
  hosts:
    gpu01: {ansible_host: 10.0.0.1}
    gpu02: {ansible_host: 10.0.0.2}
    gpu03:
    gpu04: {ansible_host: 10.0.0.4, ansible_port: "2201"}
    gpu05: {ansible_host: 10.0.0.5, ansible_user: [not, a, user]}
"""
    path = write(
        tmp_path / "h.yml",
        text.replace("    gpu05: {ansible_host: 10.0.0.5, ansible_user: [not, a, user]}\n", ""),
    )
    inv = load(path)
    for name, host in inv.hosts.items():
        assert host.connection == connection_spec(name, host.vars, host.origins), name
    assert [inv.connection(h).address for h in inv.hosts] == [
        "10.0.0.1",
        "10.0.0.2",
        "gpu03",
        "10.0.0.4",
    ]
    assert [inv.connection(h).port for h in inv.hosts] == [2222, 2222, 2222, 2201]
    # A port in the host's pattern and a user in its host_vars file are its own, not its rack's.
    own = tmp_path / "own"
    write(own / "host_vars" / "gpu03.yml", "ansible_user: other\n")
    inv = load(write(own / "h.yml", (
        "gpu:\n  vars: {ansible_user: deploy, ansible_port: 2222}\n  hosts:\n"
        "    gpu01: {ansible_host: 10.0.0.1}\n    gpu03:\n    gpu06:2299:\n"
        "    gpu04: {ansible_host: 10.0.0.4}\n"
    )))  # fmt: skip
    assert {h: (inv.connection(h).port, inv.connection(h).user) for h in inv.hosts} == {
        "gpu01": (2222, "deploy"), "gpu03": (2222, "other"), "gpu06": (2299, "deploy"),
        "gpu04": (2222, "deploy"),
    }  # fmt: skip
    # A host whose shared settings differ is read alone, and its bad value named.
    with pytest.raises(InputError, match="must be a string") as caught:
        load(write(tmp_path / "bad.yml", text))
    assert (caught.value.key, caught.value.line) == ("ansible_user", 8)


def test_connection_spec_is_immutable() -> None:
    spec = load(EQUIVALENT / "hosts.yml").connection("prom02")
    with pytest.raises(AttributeError):
        spec.port = 22  # type: ignore[misc]


# -- views


def test_to_dict_masks_secrets_and_is_json(tmp_path: Path) -> None:
    text = "gpu:\n  vars:\n    smtp_password: s3cr3t-value\n  hosts:\n    gpu01:\n"
    inv = load(write(tmp_path / "h.yml", text))
    view = inv.to_dict()
    assert view["hosts"]["gpu01"]["vars"]["smtp_password"] == MASK
    assert view["groups"]["gpu"]["vars"]["smtp_password"] == MASK
    assert "s3cr3t-value" not in json.dumps(view)
    assert inv.to_dict(mask_secrets=False)["hosts"]["gpu01"]["vars"]["smtp_password"] == (
        "s3cr3t-value"
    )


def test_to_dict_for_one_host_shows_groups_connection_and_vars() -> None:
    view = load(EQUIVALENT / "hosts.yml").to_dict(host="prom02")
    assert view["name"] == "prom02"
    assert view["groups"] == ["alertmanager", "monitoring", "prometheus"]
    assert view["connection"]["port"] == 2222
    assert view["vars"]["cluster"] == "lab"


def test_to_dict_of_an_unknown_host_is_an_input_error() -> None:
    with pytest.raises(InputError) as caught:
        load(EQUIVALENT / "hosts.yml").to_dict(host="gpu99")
    assert caught.value.key == "gpu99"


def test_magic_variables_describe_the_host_and_the_inventory() -> None:
    inv = load(EQUIVALENT / "hosts.yml")
    magic = inv.magic_vars("prom01")
    assert magic["inventory_hostname"] == "prom01"
    assert magic["group_names"] == ["alertmanager", "monitoring", "prometheus"]
    assert magic["groups"]["prometheus"] == ["prom01", "prom02"]
    assert magic["hostvars"]["prom02"]["ansible_host"] == "10.0.0.12"


# -- the example inventory


def test_example_inventory_follows_the_shared_contracts() -> None:
    example = Path(__file__).parent.parent.parent / "inventories" / "example"
    inv = load(example)
    assert inv.warnings == []
    for group in ("gpu", "prometheus", "alertmanager", "thanos_query", "monitoring"):
        assert group in inv.groups
    assert set(inv.group_hosts("monitoring")) >= set(inv.group_hosts("prometheus"))
    assert len(inv.group_hosts("prometheus")) == 2
    assert len(inv.group_hosts("alertmanager")) >= 3
    for name in inv.group_hosts("gpu"):
        v = inv.host(name).vars
        assert isinstance(v["gpu_count"], int) and not isinstance(v["gpu_count"], bool)
        assert isinstance(v["nvswitch"], bool)
        assert v["gpu_model"] in {"H100", "H200", "A100", "V100", "B200", "GH200", "L40S", "T4"}
        assert {"rack", "cluster", "slurm_partition", "scrape_tier"} <= set(v)
        assert v["nvidia_module_flavour"] in {"auto", "open", "proprietary"}


# --- the cyclic garbage collector is paused for a load only ---------------------------------


def test_load_leaves_the_garbage_collector_running(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01: {}\n")
    assert gc.isenabled()
    load_inventory(tmp_path / "hosts.yml")
    assert gc.isenabled()


def test_a_failed_load_leaves_the_garbage_collector_running(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    'bad name!': {}\n")
    with pytest.raises(InputError):
        load_inventory(tmp_path / "hosts.yml")
    assert gc.isenabled()


def test_load_does_not_turn_on_a_collector_the_caller_turned_off(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01: {}\n")
    gc.disable()
    try:
        load_inventory(tmp_path / "hosts.yml")
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- names of any script (issue 14, 1.4)


def test_host_and_group_names_may_hold_letters_of_any_script(tmp_path: Path) -> None:
    inv = load(
        write(
            tmp_path / "h.yml",
            "all:\n  hosts:\n    příbor:\n      city: Příbor\n  children:\n    česko:\n"
            "      hosts:\n        ostrava.cz:\n        příbor:\n",
        )
    )
    assert inv.group_hosts("česko") == ["ostrava.cz", "příbor"]
    assert inv.host("příbor").vars["city"] == "Příbor"


def test_a_host_name_with_a_character_no_name_holds_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="invalid host name"):
        load(write(tmp_path / "h.ini", "[g]\nbad$host\n"))


# -- the inventory command (issue 14, 1.1)


def test_inventory_command_with_a_limit_shows_the_selected_hosts_only(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from deployer.cli import cli

    path = write(
        tmp_path / "hosts", "n1\n[gpu]\ngpu01\ngpu02\n[prom]\nprom01\n[rack:children]\ngpu\n"
    )
    result = CliRunner().invoke(
        cli, ["inventory", "-i", str(path), "--limit", "gpu[1]:prom01", "--output", "json"]
    )
    assert result.exit_code == 0, result.output
    view = json.loads(result.stdout)
    # In all's order, as ansible-inventory --list --limit: prom (top level) before rack's gpu.
    assert list(view["hosts"]) == ["prom01", "gpu02"]
    assert view["groups"]["gpu"]["hosts"] == ["gpu02"]
    assert set(view["groups"]) == {"all", "gpu", "prom", "rack"}  # ungrouped's n1 left out
