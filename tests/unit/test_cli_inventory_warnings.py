"""What the inventory loader warns about (a group_vars/ file that names no group, a host that is
also a group, an ``ansible_ssh_host`` the monitoring tier does not read) reaches the operator:
on stderr, once per command, leaving stdout to the command's output."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from deployer import cli as cli_mod
from deployer.cli import cli
from deployer.session import INVENTORY_WARNINGS, DeploySession, RunOptions


def inventory_dir(tmp_path: Path) -> Path:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu_nodes.yml").write_text("gpu_model: H100\n")  # a typo'd group
    (tmp_path / "hosts.yml").write_text(
        "gpu:\n  hosts:\n    gpu01: {ansible_ssh_host: 10.0.0.1, gpu_model: H100, gpu_count: 8}\n"
    )
    return tmp_path


def test_each_inventory_warning_is_said_on_stderr_and_stdout_stays_the_output(tmp_path):
    result = CliRunner().invoke(
        cli, ["inventory", "-i", str(inventory_dir(tmp_path)), "--output", "json"]
    )
    assert result.exit_code == 0, result.output
    assert "gpu01" in json.loads(result.stdout)["hosts"]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING ")]
    assert len(warnings) == 2
    assert any("group_vars/gpu_nodes: no group 'gpu_nodes' in the inventory" in w for w in warnings)
    assert any("gpu01: SSH to 10.0.0.1, the monitoring tier to gpu01" in w for w in warnings)


def test_a_command_that_loads_the_inventory_again_says_each_warning_once(capsys):
    say = cli_mod._say_once()
    for _ in range(2):  # up loads once per pass of a rotation
        say("group_vars/x.yml: no group 'x' in the inventory")
    assert capsys.readouterr().err.count("WARNING group_vars/x.yml") == 1


def test_a_library_caller_is_told_nothing_and_reads_the_warnings_itself(tmp_path, capsys):
    assert INVENTORY_WARNINGS.get() is None
    session = DeploySession.load(RunOptions(inventory=inventory_dir(tmp_path)), plan=False)
    assert capsys.readouterr().err == ""
    assert len(session.inventory.warnings) == 2
