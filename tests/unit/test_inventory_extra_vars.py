"""-e extra vars: key=value pairs (strings), @file, and inline JSON/YAML, as Ansible parses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.inventory import parse_extra_vars

BAD = Path(__file__).parent.parent / "fixtures" / "inventories" / "bad"


def test_key_value_pairs_are_strings_and_one_item_may_hold_several() -> None:
    assert parse_extra_vars(["gpu_count=8 nvidia_driver_branch=580"]) == {
        "gpu_count": "8",
        "nvidia_driver_branch": "580",
    }


def test_quoted_values_may_hold_spaces_and_equals_signs() -> None:
    assert parse_extra_vars(["note='two words' expr=a=b"]) == {"note": "two words", "expr": "a=b"}


def test_inline_json_keeps_its_types() -> None:
    assert parse_extra_vars(['{"gpu_count": 8, "nvswitch": true}']) == {
        "gpu_count": 8,
        "nvswitch": True,
    }


def test_at_file_reads_a_yaml_file(tmp_path: Path) -> None:
    (tmp_path / "vars.yml").write_text("dcgm_version: 4.4.2\ngpu_count: 8\n")
    assert parse_extra_vars([f"@{tmp_path / 'vars.yml'}"]) == {
        "dcgm_version": "4.4.2",
        "gpu_count": 8,
    }


def test_empty_items_are_ignored() -> None:
    assert parse_extra_vars(["", "a=1"]) == {"a": "1"}


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("gpu_count", "expected key=value"),
        ("=8", "expected key=value"),
        ("gpu-count=8", "invalid variable name"),
        ("inventory_hostname=x", "invalid variable name"),
        ("note='unclosed", "cannot parse"),
        ("./vars.yml", "prefixed with '@'"),
        ("/etc/gpumon/vars.yml", "prefixed with '@'"),
        ("[1, 2]", "must be a mapping"),
    ],
)
def test_bad_inline_extra_vars_are_refused_naming_the_item(item: str, words: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_extra_vars(["ok=1", item])
    assert caught.value.source == "-e"
    assert caught.value.key == item
    assert words in caught.value.message


def test_bad_inline_json_is_refused_naming_the_item() -> None:
    with pytest.raises(InputError, match="invalid YAML") as caught:
        parse_extra_vars(['{"gpu_count": 8'])
    assert caught.value.source == '-e {"gpu_count": 8'


def test_missing_extra_vars_file_is_refused_naming_the_file() -> None:
    with pytest.raises(InputError, match="cannot read") as caught:
        parse_extra_vars([f"@{BAD / 'no-such-vars.yml'}"])
    assert caught.value.source == str(BAD / "no-such-vars.yml")


def test_extra_vars_file_holding_a_list_is_refused_naming_file_and_line() -> None:
    with pytest.raises(InputError, match="mapping") as caught:
        parse_extra_vars([f"@{BAD / 'extra_list.yml'}"])
    assert (caught.value.source, caught.value.line) == (str(BAD / "extra_list.yml"), 1)


def test_extra_vars_file_with_a_bad_variable_name_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "vars.yml").write_text("ok: 1\nbad name: 2\n")
    with pytest.raises(InputError, match="invalid variable name") as caught:
        parse_extra_vars([f"@{tmp_path / 'vars.yml'}"])
    assert (caught.value.line, caught.value.key) == (2, "bad name")
