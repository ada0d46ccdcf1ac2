"""The daemons' flag formats, as their own parsers take them (sources cited in varformats.py), and
the role variables that carry them refused before any host is touched, naming host and variable."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer import session as session_mod
from deployer.cli import _register_subcommands, cli
from deployer.errors import InputError
from deployer.roles import load_role
from deployer.varformats import FORMATS, prometheus_seconds

ACCEPTED = {
    # model.ParseDuration (prometheus/common v0.39.0)
    "prometheus_duration": ["0", "15d", "1w2d", "90m", "1y", "2h30m", "500ms", "1d12h"],
    # time.ParseDuration (Go, through kingpin's Duration)
    "go_duration": ["0", "120h", "1h30m", "15s", "1.5h", "300ms", "-2s", "+3m", "10us", "5µs"],
    # units.ParseBase2Bytes (alecthomas/units)
    "base2_bytes": ["0", "512MB", "1GB", "1TB", "10GiB", "1.5GB", "1GB512MB", "100B"],
    "listen_address": ["0.0.0.0:9090", ":9090", "[::1]:9090", "localhost:9090", "prom-1:0"],
    "host": ["10.0.0.1", "prom01", "prom01.example.org", "::1"],
    "port": ["1", "9090", "65535"],
    "cli_flag": ["--web.enable-admin-api", "--query.max-samples=50000000", "--log.level=debug"],
}
REFUSED = {
    "prometheus_duration": ["15x", "", "1.5h", "15", "2d1w", "1h1h", "-1d", "15 d", "1000000y"],
    "go_duration": ["", "15x", "1d", "15", "h", "1..5s", "9999999999h"],
    "base2_bytes": ["", "512", "1kB", "1 GB", "1GiB512MB", "5x", "1gb"],
    "listen_address": ["9090", "0.0.0.0", "0.0.0.0:99999", "::1:9090", "host:port", "a b:1"],
    "host": ["", "a b", "prom01:9094", "-bad"],
    "port": ["0", "65536", "http", ""],
    "cli_flag": ["-v", "web.enable-lifecycle", "--", "--x\n--y", ""],
}


@pytest.mark.parametrize(
    ("fmt", "value"), [(f, v) for f, vs in ACCEPTED.items() for v in vs], ids=str
)
def test_format_accepts_what_the_daemon_accepts(fmt, value):
    assert FORMATS[fmt](value) is None


@pytest.mark.parametrize(
    ("fmt", "value"), [(f, v) for f, vs in REFUSED.items() for v in vs], ids=str
)
def test_format_refuses_what_the_daemon_refuses(fmt, value):
    assert FORMATS[fmt](value)


ROOT = Path(__file__).resolve().parents[2]


def test_the_product_roles_specs_load_and_name_known_formats():
    for role in ("prometheus", "alertmanager"):
        specs = load_role([ROOT / "roles"], role).variables
        assert specs and all(s.format in FORMATS for s in specs)


def test_every_flag_variable_of_the_product_roles_has_a_valid_default():
    from deployer.plan import Planner
    from deployer.roles import Play

    class Inventory:
        hosts = {"m1": None}
        groups = {"all": None, "prometheus": None, "alertmanager": None}

        def group_hosts(self, group):
            return ["m1"]

        def resolve_vars(self, host, defaults):
            return {**defaults, "facts": {"arch": "x86_64"}}

    planner = Planner(Inventory(), [ROOT / "roles"], None)
    for role in ("prometheus", "alertmanager"):
        play = Play(name=role, hosts="all", roles=(role,))
        variables = planner.host_vars("m1", play)
        for spec in planner.role(role).variables:
            planner._check_variable("m1", spec, variables)  # raises on a bad default


# ---- through the CLI: exit 2, the host and variable named, no connection -------------------

INVENTORY = """\
all:
  children:
    prometheus:
      hosts:
        prom01: {ansible_host: 192.0.2.11}
        prom02: {ansible_host: 192.0.2.12}
"""


@pytest.fixture
def no_connections(monkeypatch):
    def refuse(self, host):
        raise AssertionError(f"a connection to {host} was attempted")

    monkeypatch.setattr(session_mod.DeploySession, "open_connection", refuse)


def up(tmp_path: Path, *extra: str):
    (tmp_path / "inv.yml").write_text(INVENTORY)
    _register_subcommands()
    return CliRunner().invoke(cli, ["up", "-i", str(tmp_path / "inv.yml"), *extra])


def test_a_retention_prometheus_would_refuse_fails_before_any_connection(tmp_path, no_connections):
    result = up(tmp_path, "-e", "prometheus_retention_time=15x")
    assert result.exit_code == 2, result.output
    assert "prometheus_retention_time" in result.output
    assert "on host prom01" in result.output and "'15x'" in result.output
    assert "--storage.tsdb.retention.time" in result.output
    assert "set at -e" in result.output
    assert "roles/prometheus/meta/argument_specs.yml" in result.output


def test_a_bad_alertmanager_retention_names_its_inventory_file_and_line(tmp_path, no_connections):
    (tmp_path / "inv.yml").write_text(
        INVENTORY.replace("prometheus:", "alertmanager:")
        + "  vars:\n    alertmanager_data_retention: 5days\n"
    )
    _register_subcommands()
    result = CliRunner().invoke(cli, ["up", "-i", str(tmp_path / "inv.yml")])
    assert result.exit_code == 2, result.output
    assert "alertmanager_data_retention" in result.output and "'5days'" in result.output
    assert "inv.yml:" in result.output


def test_an_extra_flag_that_is_no_flag_is_refused(tmp_path, no_connections):
    result = up(tmp_path, "-e", '{"prometheus_extra_flags": ["web.enable-admin-api"]}')
    assert result.exit_code == 2, result.output
    assert "prometheus_extra_flags" in result.output and "not a long flag" in result.output


def test_argument_specs_with_an_unknown_format_are_refused_naming_the_file(tmp_path):
    role = tmp_path / "r"
    (role / "meta").mkdir(parents=True)
    (role / "meta" / "argument_specs.yml").write_text(
        textwrap.dedent(
            """\
            argument_specs:
              main:
                options:
                  r_timeout: {type: str, format: duration_ish}
            """
        )
    )
    with pytest.raises(InputError) as failed:
        load_role([tmp_path], "r")
    assert "argument_specs.yml" in str(failed.value) and "r_timeout.format" in str(failed.value)


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15), ("1m30s", 90), ("500ms", 0.5), ("2h", 7200)]
)
def test_a_prometheus_duration_in_seconds(text, seconds):
    assert prometheus_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "s", "1s1m"])
def test_what_is_no_prometheus_duration_has_no_seconds(text):
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        prometheus_seconds(text)
