"""``gpumon-deploy upgrade-driver``: bad input is exit 2 naming the option, before any host is
contacted (the inventory's host address would refuse a connection)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from deployer.cli import cli

INVENTORY = "all:\n  children:\n    gpu:\n      hosts:\n        g1: {ansible_host: 192.0.2.1, gpu_model: H100, gpu_count: 8}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "581"], "--to: unknown branch R581"),
        (["--to", "58x.1"], "--to: '58x.1' is neither a branch"),
        ([], "--to: --to BRANCH_OR_VERSION is required"),
        (["--to", "580", "--batch-size", "0"], "--batch-size: '0' must be at least 1"),
        (["--to", "580", "--max-unavailable", "120%"], "--max-unavailable"),
        (["--to", "580", "--max-failures", "0"], "--max-failures must be at least 1"),
        (["--to", "580", "--drain", "command"], "--drain-command: --drain command needs"),
        (["--to", "580", "--resume", "no-such-run"], "--resume: no run 'no-such-run'"),
    ],
)
def test_bad_input_exits_2_before_contacting_any_host(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("GPUMON_ROLLOUT_STATE_DIR", str(tmp_path / "runs"))
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    result = CliRunner().invoke(cli, ["upgrade-driver", "-i", str(inv), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "no host was contacted" in result.output
