"""Every error about a variable a host lacks names the host, the variable, where it is read (the
role file and line) and where to set it, and stops the run before any host is contacted.

One representative variable per role: the role's own default removed from a copy of the
product's roles (as a role of the user's, or an edited one, would lack it), then ``up --check``
on an inventory of unreachable addresses (TEST-NET-1) with SSH forbidden outright."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from deployer import session as session_module
from deployer.cli import cli

ROOT = Path(__file__).resolve().parents[2]

INVENTORY = """\
all:
  vars:
    release_mirror_url: http://mirror.invalid/releases
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8}
    prom01: {ansible_host: 192.0.2.21}
    mon01: {ansible_host: 192.0.2.23}
  children:
    gpu: {hosts: {gpu01: {}}}
    prometheus: {hosts: {prom01: {}}}
    alertmanager: {hosts: {prom01: {}, mon01: {}}}
    thanos_query: {hosts: {mon01: {}}}
    metrics_store: {hosts: {mon01: {}}}
    grafana: {hosts: {mon01: {}}}
"""

# role -> (a variable its files read, a host of its play, extra vars the play needs to read it)
CASES = {
    "nvidia_driver": ("nvidia_repo_key_url", "gpu01", []),
    "dcgm": ("dcgm_log_level", "gpu01", []),
    "dcgm_exporter": ("dcgm_exporter_listen_address", "gpu01", []),
    "node_exporter": ("node_exporter_listen_address", "gpu01", []),
    "alertmanager": ("alertmanager_cluster_port", "mon01", []),
    "victoriametrics": ("victoriametrics_package", "mon01", []),
    "prometheus": ("prometheus_rules_xid_critical", "prom01", []),
    "thanos_sidecar": ("thanos_sidecar_grpc_port", "prom01", ["thanos_enabled=true"]),
    "thanos_query": ("thanos_query_http_port", "mon01", ["thanos_enabled=true"]),
    "grafana": ("grafana_package", "mon01", []),
}


def roles_without(tmp_path: Path, variable: str) -> Path:
    """A copy of the product's roles in which no role defines ``variable``."""
    roles = tmp_path / "roles"
    shutil.copytree(ROOT / "roles", roles)
    for defaults in roles.glob("*/defaults/main.yml"):
        data = yaml.safe_load(defaults.read_text()) or {}
        if data.pop(variable, None) is not None:
            defaults.write_text(yaml.safe_dump(data, sort_keys=False))
    return roles


@pytest.fixture
def no_ssh(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a host was contacted")

    monkeypatch.setattr(session_module, "SSHConnection", refuse)


@pytest.mark.parametrize("role", sorted(CASES))
def test_a_role_reading_an_undefined_variable_names_host_variable_and_where(role, tmp_path, no_ssh):
    variable, host, extra = CASES[role]
    roles = roles_without(tmp_path, variable)
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    args = ["up", "--check", "-i", str(inv), "--roles-path", str(roles), "--limit", host]
    for e in extra:
        args += ["-e", e]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    out = result.output
    assert f"host {host}: variable {variable} is undefined (read by " in out, out
    assert f"set it for {host} in the inventory" in out and f"-e {variable}=" in out, out
    assert "no host was contacted" in out, out
    # where it is read: a file of the role copy and a line of it that reads the variable
    m = re.search(r"read by (?P<file>[^\s:()]+):(?P<line>\d+)", out)
    assert m, out
    path = Path(m["file"])
    assert path.is_relative_to(roles), out
    assert variable in path.read_text().splitlines()[int(m["line"]) - 1], out


def test_a_variables_value_reading_an_undefined_variable_names_it_and_the_value(tmp_path, no_ssh):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY.replace("prom01: {ansible_host: 192.0.2.21}",
                                     "prom01: {ansible_host: 192.0.2.21, prometheus_port: '{{ my_port }}'}"))  # fmt: skip
    result = CliRunner().invoke(cli, ["up", "--check", "-i", str(inv), "--limit", "prom01"])
    assert result.exit_code == 2, result.output
    assert "host prom01: variable my_port is undefined" in result.output
    assert "the value of prometheus_port" in result.output
    assert "no host was contacted" in result.output


def test_a_key_missing_from_a_mapping_variable_names_the_host_the_key_and_where(tmp_path, no_ssh):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY.replace("gpu_count: 8}", "gpu_count: 8, scrape_tier: fast}"))
    tiers = '{"prometheus_scrape_tiers": {"fast": {"every": "5s"}}}'
    result = CliRunner().invoke(
        cli, ["up", "--check", "-i", str(inv), "--limit", "prom01", "-e", tiers]
    )
    assert result.exit_code == 2, result.output
    assert "host prom01" in result.output and "'interval'" in result.output, result.output
    assert "no host was contacted" in result.output
