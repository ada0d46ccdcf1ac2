"""Ansible's YAML tags and types in inventories: ``!unsafe`` text is a literal never templated,
an inline ``!vault`` value is refused by name, timestamps show as Ansible shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.inventory import load_inventory
from deployer.secrets import SecretValues
from deployer.templating import Renderer, TemplatedVars, make_environment
from deployer.unsafe import UnsafeText

UNSAFE = """
all:
  vars:
    greeting: "hello {{ inventory_hostname }}"
  hosts:
    gpu01:
      password: !unsafe 'p{{a}}ss{%w'
      patterns: !unsafe ['{{ one }}', {nested: '{{ two }}'}, 42]
      ansible_user: !unsafe '{{ not_a_user }}'
"""


def load(tmp_path: Path, text: str, name: str = "hosts.yml"):
    (tmp_path / name).write_text(text)
    return load_inventory(tmp_path / name, secrets=SecretValues())


# -- !unsafe (issue 14, 1.5)


def test_an_unsafe_value_is_read_as_the_literal_text(tmp_path: Path) -> None:
    host = load(tmp_path, UNSAFE).host("gpu01")
    assert host.vars["password"] == "p{{a}}ss{%w"
    assert isinstance(host.vars["password"], UnsafeText)


def test_unsafe_marks_every_string_inside_a_tagged_list_or_mapping(tmp_path: Path) -> None:
    patterns = load(tmp_path, UNSAFE).host("gpu01").vars["patterns"]
    assert patterns == ["{{ one }}", {"nested": "{{ two }}"}, 42]
    assert isinstance(patterns[0], UnsafeText)
    assert isinstance(patterns[1]["nested"], UnsafeText)
    assert patterns[2] == 42 and not isinstance(patterns[2], str)


def test_an_unsafe_connection_variable_is_not_rendered(tmp_path: Path) -> None:
    assert load(tmp_path, UNSAFE).connection("gpu01").user == "{{ not_a_user }}"


def test_the_renderer_never_renders_unsafe_text() -> None:
    renderer = Renderer(make_environment())
    value = UnsafeText("{{ undefined_would_fail }}")
    assert renderer.render_value(value, {}, "t", 1, "k") == "{{ undefined_would_fail }}"
    nested = {"a": [UnsafeText("{% if %}")]}
    assert renderer.render_value(nested, {}, "t", 1, "k") == {"a": ["{% if %}"]}


def test_a_variable_naming_an_unsafe_value_yields_its_text_not_its_rendering() -> None:
    renderer = Renderer(make_environment())
    variables = TemplatedVars(
        {"secret": UnsafeText("{{ boom }}"), "copy": "{{ secret }}", "line": "pw={{ secret }}"},
        renderer,
    )
    assert variables["secret"] == "{{ boom }}"
    assert variables["copy"] == "{{ boom }}"
    assert variables["line"] == "pw={{ boom }}"


def test_plain_text_with_the_same_braces_is_still_rendered() -> None:
    renderer = Renderer(make_environment())
    with pytest.raises(InputError):
        renderer.render_value("{{ undefined_would_fail }}", {}, "t", 1, "k")


def test_unsafe_text_shows_as_plain_text_in_the_inventory_view(tmp_path: Path) -> None:
    import yaml

    view = load(tmp_path, UNSAFE).to_dict(host="gpu01", mask_secrets=False)
    assert json.loads(json.dumps(view))["vars"]["ansible_user"] == "{{ not_a_user }}"
    assert "not_a_user" in yaml.safe_dump(view)


# -- inline !vault (issue 14, 1.5)


def test_an_inline_vault_value_is_refused_naming_vault_and_what_to_do(tmp_path: Path) -> None:
    text = (
        "all:\n  hosts:\n    gpu01:\n      db_password: !vault |\n"
        "        $ANSIBLE_VAULT;1.1;AES256\n        62313365396662343061393464336163\n"
    )
    with pytest.raises(InputError) as refused:
        load(tmp_path, text)
    assert refused.value.source == str(tmp_path / "hosts.yml")
    assert refused.value.line == 4
    assert "vault is not supported" in refused.value.message
    assert "-e @file" in refused.value.message


def test_an_inline_vault_value_in_group_vars_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("token: !vault |\n  $ANSIBLE_VAULT;1.1\n")
    with pytest.raises(InputError, match="vault is not supported") as refused:
        load(tmp_path, "all:\n  hosts:\n    gpu01:\n")
    assert refused.value.source == str(tmp_path / "group_vars" / "all.yml")


# -- timestamps (issue 14, 1.7)


def test_yaml_timestamps_and_dates_show_in_iso_8601_as_ansible_shows_them(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        "all:\n  vars:\n    when: 2017-03-07 10:20:49Z\n    naive: 2001-12-14 21:59:43\n"
        "    day: 2024-02-29\n  hosts:\n    gpu01:\n",
    )
    shown = inv.to_dict(host="gpu01")["vars"]
    assert shown["when"] == "2017-03-07T10:20:49+00:00"
    assert shown["naive"] == "2001-12-14T21:59:43"
    assert shown["day"] == "2024-02-29"
