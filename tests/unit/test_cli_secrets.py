"""Secrets never shown by the CLI: the ``inventory`` views and every error path (issue 12, 4)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer import cli as cli_mod
from deployer import session as session_mod
from deployer.cli import _register_subcommands, cli

TOKEN = "Zk9sl4ckT0KEN"
SMTP = "Zk9-smtp-s3cret"
RECEIVERS = f"""\
all:
  vars:
    alertmanager_global:
      smtp_auth_password: {SMTP}
    alertmanager_receivers:
      - name: oncall
        slack_configs:
          - api_url: https://hooks.slack.com/services/T0AAA/B0BBB/{TOKEN}
            channel: "#gpu"
        webhook_configs:
          - url: https://relay.example/hook/{TOKEN}2
        pagerduty_configs:
          - routing_key: {TOKEN}3
        opsgenie_configs:
          - api_key: {TOKEN}4
    thanos_remote: https://thanos:{TOKEN}5@receive.example:19291/
  children:
    monitoring:
      hosts:
        m1: {{ansible_host: 192.0.2.10}}
"""


@pytest.fixture(autouse=True)
def no_connections(monkeypatch):
    def refuse(self, host):
        raise AssertionError(f"a connection to {host} was attempted")

    monkeypatch.setattr(session_mod.DeploySession, "open_connection", refuse)


def invoke(*args: str):
    _register_subcommands()
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize(
    "view",
    [[], ["--output", "json"], ["--host", "m1"], ["--host", "m1", "--output", "json"]],
    ids=["plain", "json", "host", "host json"],
)
def test_inventory_views_show_no_receiver_secret(tmp_path, view):
    (tmp_path / "inv.yml").write_text(RECEIVERS)
    result = invoke("inventory", "-i", str(tmp_path / "inv.yml"), *view)
    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output and SMTP not in result.output
    assert "hooks.slack.com" not in result.output  # the api_url is masked whole, by its name
    assert "receive.example" in result.output  # a URL's host stays, its password goes
    assert "#gpu" in result.output and "oncall" in result.output


def test_inventory_json_masks_in_place_and_keeps_the_structure(tmp_path):
    (tmp_path / "inv.yml").write_text(RECEIVERS)
    result = invoke(
        "inventory", "-i", str(tmp_path / "inv.yml"), "--host", "m1", "--output", "json"
    )
    (receiver,) = json.loads(result.stdout)["vars"]["alertmanager_receivers"]
    assert receiver["slack_configs"] == [{"api_url": "********", "channel": "#gpu"}]
    assert receiver["webhook_configs"] == [{"url": "********"}]
    assert receiver["pagerduty_configs"] == [{"routing_key": "********"}]


def test_an_extra_var_that_does_not_parse_is_not_repeated(tmp_path):
    (tmp_path / "inv.yml").write_text(RECEIVERS)
    for bad in (f"a=1 alertmanager_smtp_auth_password={SMTP} stray", f'smtp_password="{SMTP}'):
        result = invoke("inventory", "-i", str(tmp_path / "inv.yml"), "-e", bad)
        assert result.exit_code == 2, result.output
        assert SMTP not in result.output
        assert "smtp" in result.output  # the error still names what it refuses


def test_a_bad_inventory_line_does_not_repeat_its_password(tmp_path):
    (tmp_path / "hosts.ini").write_text(f"[all:vars]\nansible_password: {SMTP}\n[g]\nh1\n")
    result = invoke("inventory", "-i", str(tmp_path / "hosts.ini"))
    assert result.exit_code == 2, result.output
    assert "hosts.ini:2" in result.output and "ansible_password" in result.output
    assert SMTP not in result.output


def write_role(tmp_path: Path, *, task: str, template: str = "", defaults: str = "") -> Path:
    role = tmp_path / "roles" / "r"
    (role / "tasks").mkdir(parents=True)
    (role / "tasks" / "main.yml").write_text(textwrap.dedent(task))
    if template:
        (role / "templates").mkdir()
        (role / "templates" / "t.j2").write_text(template)
    if defaults:
        (role / "defaults").mkdir()
        (role / "defaults" / "main.yml").write_text(defaults)
    (tmp_path / "site.yml").write_text("- hosts: all\n  roles: [r]\n")
    (tmp_path / "inv.yml").write_text(RECEIVERS)
    return tmp_path / "site.yml"


TEMPLATE_TASK = "- name: t\n  template: {src: t.j2, dest: /tmp/t}\n"


@pytest.mark.parametrize(
    ("task", "template", "defaults"),
    [
        ("- copy: {dest: /tmp/x, content: \"{{ {}[alertmanager_global.smtp_auth_password] }}\"}\n",
         "", ""),
        (TEMPLATE_TASK, "{{ {}[alertmanager_global.smtp_auth_password] }}\n", ""),
        ("- copy: {dest: /tmp/x, content: \"{{ grafana_admin_password }}\"}\n", "",
         f"grafana_admin_password: \"{SMTP}{{{{\"\n"),
    ],
    ids=["task argument", "template file", "literal secret"],
)  # fmt: skip
def test_a_template_error_does_not_repeat_a_rendered_secret(tmp_path, task, template, defaults):
    site = write_role(tmp_path, task=task, template=template, defaults=defaults)
    result = invoke("up", "-i", str(tmp_path / "inv.yml"), "--site", str(site))
    assert result.exit_code == 2, result.output
    assert SMTP not in result.output and TOKEN not in result.output
    assert "no host was contacted" in result.output


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["gpumon-deploy", *args])
    with pytest.raises(SystemExit) as exc:
        cli_mod.main()
    return exc.value.code, capsys.readouterr().err


def test_a_usage_error_does_not_repeat_a_secret_value(monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, "facts", "-i", "x", "--forks", f"password={SMTP}")
    assert code == 2
    assert "--forks" in err and SMTP not in err


def test_an_unexpected_error_shows_its_traceback_masked(monkeypatch, capsys, tmp_path):
    (tmp_path / "inv.yml").write_text(RECEIVERS)

    def broken(self, host):
        raise RuntimeError(f"boom while reading smtp_auth_password={SMTP}")

    monkeypatch.setattr(session_mod.DeploySession, "inventory_view", broken)
    code, err = run_main(monkeypatch, capsys, "inventory", "-i", str(tmp_path / "inv.yml"))
    assert code == 1
    assert "Traceback" in err and "RuntimeError: boom" in err
    assert SMTP not in err


def test_an_unquoted_password_with_a_space_is_not_repeated_in_the_host_line_error(tmp_path):
    (tmp_path / "hosts.ini").write_text(f"[g]\nh1 ansible_password={SMTP} rest-of-it x=1\n")
    result = invoke("inventory", "-i", str(tmp_path / "hosts.ini"))
    assert result.exit_code == 2, result.output
    assert "hosts.ini:2" in result.output and "quote a value with spaces" in result.output
    assert SMTP not in result.output and "rest-of-it" not in result.output
