"""``gpumon-deploy init``: the GPU hosts' facts written beside an existing inventory as the
variables the product needs (shared values to group_vars/gpu.yml, differing ones to host_vars/),
the --group mapping to group_vars/all.yml; declared values kept; existing files never rewritten."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from deployer import session as session_mod
from deployer.cli import cli
from deployer.facts import GPU, HostFacts

INVENTORY = """\
[slurm-master]
login01 ansible_host=192.0.2.10

[slurm-node]
gpu01 ansible_host=192.0.2.11
gpu02 ansible_host=192.0.2.12
"""

SEEN = {"gpu01": ("NVIDIA H100 80GB HBM3", 8), "gpu02": ("NVIDIA H100 80GB HBM3", 8)}


def facts_of(host: str, name: str, count: int) -> HostFacts:
    gpus = [
        GPU(i, f"GPU-{host}-{i}", name, 81559, f"0000:{i:02x}:00.0", "Disabled")
        for i in range(count)
    ]
    return HostFacts(
        host=host, gpus=gpus, nvidia_smi="ok", driver_loaded="580.105.08", nvswitch=count == 8
    )


@pytest.fixture
def seen(monkeypatch):
    """The hosts as their facts show them (no connection is opened)."""
    hosts = dict(SEEN)

    def gather(self, names, forks=50):
        self.facts.update({h: facts_of(h, *hosts[h]) for h in names})
        return {h: self.facts[h] for h in names}

    def refuse(self, host):
        raise AssertionError(f"a connection to {host} was attempted")

    monkeypatch.setattr(session_mod.DeploySession, "gather_facts", gather)
    monkeypatch.setattr(session_mod.DeploySession, "open_connection", refuse)
    return hosts


def write(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    (tmp_path / "inventory").write_text(INVENTORY)
    for name, text in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path / "inventory"


def run(*args: str):
    return CliRunner().invoke(cli, ["init", *args])


def read(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_shared_values_go_to_group_vars_gpu_and_the_mapping_to_all(tmp_path, seen):
    inv = write(tmp_path)
    result = run("-i", str(inv), "--group", "gpu=slurm-node")
    assert result.exit_code == 0, result.output
    assert (
        "gpu01: gpu_model=H100, gpu_count=8, nvswitch=True, nvidia_driver_branch=580"
        in result.output
    )
    assert read(tmp_path / "group_vars/gpu.yml") == {
        "gpu_count": 8, "gpu_model": "H100", "nvidia_driver_branch": "580", "nvswitch": True,
    }  # fmt: skip
    assert read(tmp_path / "group_vars/all.yml") == {"gpumon_groups": {"gpu": ["slurm-node"]}}
    assert (tmp_path / "group_vars/gpu.yml").stat().st_mode & 0o777 == 0o644
    # and the first check is one command away, without --group now
    check = CliRunner().invoke(cli, ["check", "-i", str(inv), "--offline"])
    assert check.exit_code == 0, check.output
    assert "NOT JUDGED" not in check.output


def test_values_that_differ_between_hosts_go_to_each_hosts_host_vars(tmp_path, seen):
    seen["gpu02"] = ("NVIDIA A100-SXM4-80GB", 4)
    inv = write(tmp_path)
    assert run("-i", str(inv), "--group", "gpu=slurm-node").exit_code == 0
    assert read(tmp_path / "group_vars/gpu.yml") == {"nvidia_driver_branch": "580"}
    assert read(tmp_path / "host_vars/gpu01.yml") == {
        "gpu_count": 8,
        "gpu_model": "H100",
        "nvswitch": True,
    }
    assert read(tmp_path / "host_vars/gpu02.yml") == {
        "gpu_count": 4,
        "gpu_model": "A100",
        "nvswitch": False,
    }


def test_declared_values_are_kept_and_a_contradicted_one_is_reported(tmp_path, seen):
    inv = write(
        tmp_path,
        {"group_vars/all.yml": "gpumon_groups: {gpu: [slurm-node]}\n",
         "group_vars/slurm-node.yml": "gpu_model: H100\ngpu_count: 4\nnvidia_driver_version: '580.105.08'\n"},
    )  # fmt: skip
    result = run("-i", str(inv))
    assert result.exit_code == 1
    assert "already declared: gpu01: gpu_model = H100" in result.output
    assert "MISMATCH gpu01: gpu_count declared 4, found 8" in result.output
    assert read(tmp_path / "group_vars/gpu.yml") == {"nvswitch": True}


def test_an_existing_file_is_never_rewritten(tmp_path, seen):
    inv = write(tmp_path, {"group_vars/gpu.yml": "rack: r1\n"})
    result = run("-i", str(inv), "--group", "gpu=slurm-node")
    assert result.exit_code == 0
    assert (tmp_path / "group_vars/gpu.yml").read_text() == "rack: r1\n"
    assert "group_vars/gpu.yml exists, not rewritten: add" in result.output
    assert "gpu_model: H100" in result.output


def test_check_writes_nothing(tmp_path, seen):
    inv = write(tmp_path)
    result = run("-i", str(inv), "--group", "gpu=slurm-node", "--check")
    assert result.exit_code == 0
    assert "would write" in result.output
    assert not (tmp_path / "group_vars").exists()


def test_without_a_gpu_group_it_says_to_map_one(tmp_path, seen):
    result = run("-i", str(write(tmp_path)))
    assert result.exit_code == 2
    assert "--group gpu=GROUP" in result.output
