"""copy_by_mig_mode, run for real in a shell with a stand-in nvidia-smi: the content planned for
the mode the host's GPUs report when the task runs, kept as it is while nvidia-smi cannot say."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deployer.connection import CommandResult
from deployer.modules import MODULES
from deployer.modules.base import ArgError

PLAIN, MIG = "field, gauge, plain\n", "field, gauge, plain\nmig, gauge, instances\n"


class Local:
    """A host session: ``sh -c`` here, with the stand-in nvidia-smi first on PATH."""

    name = "local"

    def __init__(self, bindir: Path) -> None:
        self.env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}

    def run(self, command, *, stdin=None, timeout=None):
        p = subprocess.run(
            ["sh", "-c", command], input=stdin, capture_output=True, timeout=timeout, env=self.env
        )
        return CommandResult(command, p.returncode, p.stdout.decode(), p.stderr.decode())


def nvidia_smi(bindir: Path, lines: str | None, rc: int = 0) -> None:
    """A stand-in answering --query-gpu=mig.mode.current (None: no nvidia-smi at all)."""
    bindir.mkdir(exist_ok=True)
    path = bindir / "nvidia-smi"
    if lines is None:
        path.unlink(missing_ok=True)
        return
    path.write_text(f"#!/bin/sh\nprintf '%s' '{lines}'\nexit {rc}\n")
    path.chmod(0o755)


@pytest.fixture
def task(tmp_path):
    module = MODULES["copy_by_mig_mode"]()
    args = module.validate(
        {"dest": str(tmp_path / "counters.csv"), "content": PLAIN, "mig_content": MIG}
    )
    return module, args, Local(tmp_path / "bin")


def converge(module, args, host) -> bool:
    """One engine pass: read, write if it differs, read again (must be in its state)."""
    obs = module.observe(args, host.run(module.read_script(args)))
    if obs.in_desired_state:
        return False
    module.write(host, args, obs)
    assert module.observe(args, host.run(module.read_script(args))).in_desired_state
    return True


def test_a_host_with_a_gpu_in_mig_mode_gets_the_mig_content(task, tmp_path):
    module, args, host = task
    nvidia_smi(tmp_path / "bin", "Enabled\nDisabled\n")  # gpu05: GPU 0 in MIG mode, GPU 1 not
    assert converge(module, args, host) is True
    assert Path(args["dest"]).read_text() == MIG
    assert converge(module, args, host) is False


def test_a_host_without_mig_gets_the_plain_content(task, tmp_path):
    module, args, host = task
    nvidia_smi(tmp_path / "bin", "Disabled\nDisabled\n")
    assert converge(module, args, host) is True
    assert Path(args["dest"]).read_text() == PLAIN


def test_a_board_without_mig_support_gets_the_plain_content(task, tmp_path):
    module, args, host = task
    nvidia_smi(tmp_path / "bin", "[N/A]\n")  # L40S, T4: no MIG mode at all
    converge(module, args, host)
    assert Path(args["dest"]).read_text() == PLAIN


def test_while_nvidia_smi_cannot_answer_the_file_keeps_its_planned_content(task, tmp_path):
    module, args, host = task
    nvidia_smi(tmp_path / "bin", "Enabled\n")
    converge(module, args, host)
    nvidia_smi(tmp_path / "bin", "Failed to initialize NVML: Driver/library version mismatch\n", 18)
    assert converge(module, args, host) is False
    assert Path(args["dest"]).read_text() == MIG


def test_a_new_file_on_a_host_without_a_driver_gets_the_plain_content(task, tmp_path):
    module, args, host = task
    nvidia_smi(tmp_path / "bin", None)
    assert converge(module, args, host) is True
    assert Path(args["dest"]).read_text() == PLAIN


def test_mig_mode_turned_off_later_switches_the_file_back(task, tmp_path):
    module, args, host = task
    nvidia_smi(tmp_path / "bin", "Enabled\n")
    converge(module, args, host)
    nvidia_smi(tmp_path / "bin", "Disabled\n")
    assert converge(module, args, host) is True
    assert Path(args["dest"]).read_text() == PLAIN


def test_both_contents_are_required_and_the_path_absolute():
    module = MODULES["copy_by_mig_mode"]()
    for args, key in (
        ({"dest": "/x", "content": "a"}, "mig_content"),
        ({"dest": "x", "content": "a", "mig_content": "b"}, "dest"),
    ):
        with pytest.raises(ArgError) as err:
            module.validate(args)
        assert err.value.key == key


def test_the_gpu_plan_carries_both_csvs_whatever_the_facts_say():
    from deployer import dcgm_fields
    from deployer.gpu import gpu_plan

    plan = gpu_plan.template_plan(
        "g1", {"gpu_model": "H100", "gpu_count": 2, "dcgm_exporter_version": "4.5.3-4.8.2"}
    )
    field = dcgm_fields.metric("gr_engine_active")
    assert field not in plan["exporter_csv"]
    assert field in plan["exporter_csv_mig"]
