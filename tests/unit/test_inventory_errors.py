"""Malformed inventories and variable files are refused with the file and line or key named.

Every fixture under tests/fixtures/inventories/bad/ is refused by load_inventory with an
InputError, and by ``gpumon-deploy inventory`` with exit status 2 and the location printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer.errors import InputError
from deployer.inventory import load_inventory

BAD = Path(__file__).parent.parent / "fixtures" / "inventories" / "bad"

# fixture, file the error names (relative to BAD), line (None: no line), key (None: no key),
# words of the message.
CASES = [
    ("yaml_syntax.yml", "yaml_syntax.yml", 6, None, "invalid YAML"),
    ("yaml_toplevel_list.yml", "yaml_toplevel_list.yml", 2, None, "mapping of group names"),
    (
        "yaml_hosts_list.yml",
        "yaml_hosts_list.yml",
        4,
        "all.children.gpu.hosts",
        "must be a mapping",
    ),
    ("yaml_vars_list.yml", "yaml_vars_list.yml", 4, "gpu.vars", "must be a mapping"),
    ("yaml_group_scalar.yml", "yaml_group_scalar.yml", 3, "all.children.gpu", "must be a mapping"),
    ("yaml_unknown_key.yml", "yaml_unknown_key.yml", 4, "all.children.gpu.host", "unknown key"),
    ("yaml_cycle.yml", "yaml_cycle.yml", 10, "prometheus.children.monitoring", "cycle"),
    ("yaml_range_reversed.yml", "yaml_range_reversed.yml", 3, "gpu[04:01]", "begin after end"),
    ("yaml_range_width.yml", "yaml_range_width.yml", 3, "gpu[01:4]", "same width"),
    ("yaml_bad_var_name.yml", "yaml_bad_var_name.yml", 5, "gpu-model", "invalid variable name"),
    ("yaml_host_vars_list.yml", "yaml_host_vars_list.yml", 3, "gpu.hosts.gpu01", "mapping"),
    ("yaml_int_host.yml", "yaml_int_host.yml", 3, "1234", "must be a string"),
    ("yaml_bad_port.yml", "yaml_bad_port.yml", 4, "ansible_port", "out of range"),
    ("yaml_bad_become.yml", "yaml_bad_become.yml", 3, "ansible_become", "boolean"),
    ("yaml_bad_policy.yml", "yaml_bad_policy.yml", 4, "gpumon_host_key_policy", "verify"),
    ("yaml_all_as_child.yml", "yaml_all_as_child.yml", 3, "gpu.children.all", "'all'"),
    ("yaml_duplicate_host.yml", "yaml_duplicate_host.yml", 5, "gpu01", "duplicate key"),
    ("yaml_magic_var.yml", "yaml_magic_var.yml", 4, "inventory_hostname", "magic variable"),
    ("yaml_empty.yml", "yaml_empty.yml", None, None, "empty"),
    ("yaml_plugin.yml", "yaml_plugin.yml", 1, "plugin", "plugin configuration"),
    ("yaml_bad_host_name.yml", "yaml_bad_host_name.yml", 3, "gpu 01", "invalid host name"),
    ("ini_undefined_child.ini", "ini_undefined_child.ini", 6, "alertmanager", "never declared"),
    ("ini_vars_undeclared.ini", "ini_vars_undeclared.ini", 4, "gpus", "never declared"),
    ("ini_bad_section.ini", "ini_bad_section.ini", 4, None, "invalid section header"),
    ("ini_section_type.ini", "ini_section_type.ini", 4, None, "unknown type 'child'"),
    ("ini_host_var_no_equals.ini", "ini_host_var_no_equals.ini", 3, "ansible_port", "key=value"),
    ("ini_unclosed_quote.ini", "ini_unclosed_quote.ini", 2, None, "No closing quotation"),
    ("ini_cycle.ini", "ini_cycle.ini", 8, "c.children.a", "c -> a -> b -> c"),
    ("ini_trailing_colon.ini", "ini_trailing_colon.ini", 2, "gpu01:", "followed by a port"),
    ("ini_vars_no_equals.ini", "ini_vars_no_equals.ini", 6, None, "key=value"),
    ("ini_bad_var_name.ini", "ini_bad_var_name.ini", 2, "gpu.model", "invalid variable name"),
    ("ini_bad_port.ini", "ini_bad_port.ini", 2, "ansible_port", "integer port"),
    ("ini_range_step_zero.ini", "ini_range_step_zero.ini", 2, "gpu[01:08:0]", "step"),
    ("bad_utf8.ini", "bad_utf8.ini", None, None, "cannot read"),
    ("gv_not_mapping", "gv_not_mapping/group_vars/gpu.yml", 2, None, "mapping"),
    ("gv_bad_yaml", "gv_bad_yaml/group_vars/all.yml", 4, None, "invalid YAML"),
    ("gv_ambiguous", "gv_ambiguous/group_vars/gpu", None, "gpu", "more than once"),
    ("gv_bad_port", "gv_bad_port/group_vars/gpu.yml", 2, "ansible_port", "integer port"),
    ("hv_bad_var_name", "hv_bad_var_name/host_vars/gpu01", 2, "2nd_nic", "invalid variable"),
    ("hv_vault", "hv_vault/host_vars/gpu01.yml", 1, None, "vault"),
    ("hv_dir_bad_file", "hv_dir_bad_file/host_vars/gpu01/20-conn.yml", 2, "ansible_become", "bool"),
]


def test_every_bad_fixture_has_a_case() -> None:
    fixtures = {p.name for p in BAD.iterdir() if not p.name.startswith("extra_")}
    assert fixtures == {case[0] for case in CASES}
    assert len(CASES) >= 20


@pytest.mark.parametrize(("fixture", "source", "line", "key", "words"), CASES, ids=lambda c: c)
def test_malformed_inventory_is_refused_naming_where(
    fixture: str, source: str, line: int | None, key: str | None, words: str
) -> None:
    with pytest.raises(InputError) as caught:
        load_inventory(BAD / fixture)
    err = caught.value
    assert err.source == str(BAD / source)
    assert err.line == line
    assert err.key == key
    assert words in err.message


@pytest.mark.parametrize(("fixture", "source", "line", "key", "words"), CASES, ids=lambda c: c)
def test_cli_inventory_command_exits_2_and_prints_where(
    fixture: str, source: str, line: int | None, key: str | None, words: str
) -> None:
    from deployer.cli import cli

    result = CliRunner().invoke(cli, ["inventory", "-i", str(BAD / fixture)])
    assert result.exit_code == 2, result.output
    where = str(BAD / source) + (f":{line}" if line is not None else "")
    assert where in result.output


def test_missing_inventory_path_is_refused() -> None:
    with pytest.raises(InputError, match="not found") as caught:
        load_inventory(BAD / "no-such-inventory.yml")
    assert caught.value.source == str(BAD / "no-such-inventory.yml")


def test_inventory_directory_without_inventory_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "notes.md").write_text("not an inventory\n")
    with pytest.raises(InputError, match="no inventory files"):
        load_inventory(tmp_path)


def test_bad_extra_var_type_names_the_variable_and_the_flag() -> None:
    with pytest.raises(InputError) as caught:
        load_inventory(BAD.parent / "equivalent" / "hosts.yml", {"ansible_port": "ssh"})
    assert caught.value.key == "ansible_port"
    assert caught.value.source == "-e"


def test_invalid_extra_var_name_passed_to_load_is_refused() -> None:
    with pytest.raises(InputError, match="invalid variable name") as caught:
        load_inventory(BAD.parent / "equivalent" / "hosts.yml", {"gpu-model": "H100"})
    assert caught.value.key == "gpu-model"


def test_a_dynamic_inventory_script_is_refused_by_name_and_not_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    script = tmp_path / "inventory.py"
    script.write_text(f"#!/bin/sh\ntouch {ran}\necho '{{}}'\n")
    script.chmod(0o755)
    with pytest.raises(InputError, match=r"dynamic inventory scripts .* are not run") as refused:
        load_inventory(
            script,
        )
    assert refused.value.source == str(script)
    assert not ran.exists()


def test_a_comma_separated_host_list_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="comma-separated host list"):
        load_inventory(
            "gpu01,gpu02,",
        )
