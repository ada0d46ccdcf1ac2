"""ansible-core, the reference for how an inventory reads: where it is installed and how to run it.

``scripts/setup`` installs ansible-core (pinned in ``ansible-reference.txt``) into a virtualenv
of its own, ``.venv-ansible`` at the repository root (``$GPUMON_ANSIBLE_REFERENCE`` names another
one), never into the product's ``.venv``. Every run is isolated from the user's Ansible set-up:
an empty ``ansible.cfg`` named by ``ANSIBLE_CONFIG``, ``HOME`` and ``ANSIBLE_HOME`` in a temporary
folder that is also the working directory, no other ``ANSIBLE_*`` variable inherited. Unparsable
sources are errors, not warnings (``ANSIBLE_INVENTORY_UNPARSED_FAILED``,
``ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED``), as gpumon-deploy refuses them.

Without the reference the parity tests skip, saying why; under CI (``CI`` set) they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_VAR = "GPUMON_ANSIBLE_REFERENCE"
# The pin scripts/setup installs: "ansible-core==2.19.14".
PIN_FILE = Path(__file__).with_name("ansible-reference.txt")
ANSIBLE_REFERENCE_VERSION = PIN_FILE.read_text().strip().partition("==")[2]
DRIVER = Path(__file__).with_name("ansible_driver.py")
# Generous: the whole corpus takes about 20 s of CPU; a shared 2-core machine may take longer.
RUN_TIMEOUT_S = 900


def reference_venv() -> Path:
    return Path(os.environ.get(ENV_VAR) or REPO / ".venv-ansible")


def reference_python() -> Path:
    """The reference virtualenv's Python; skips (fails under CI) when it is missing or holds
    another ansible-core than the pinned one."""
    python = reference_venv() / "bin" / "python"
    problem = None
    if not python.is_file():
        problem = f"ansible-core reference not installed: no {python} (run scripts/setup)"
    else:
        version = subprocess.run(
            [str(python), "-c", "import ansible.release as r; print(r.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if version.returncode != 0:
            problem = f"ansible-core not importable by {python}: {version.stderr.strip()[-300:]}"
        elif version.stdout.strip() != ANSIBLE_REFERENCE_VERSION:
            problem = (
                f"{python} has ansible-core {version.stdout.strip()}, the parity tests pin "
                f"{ANSIBLE_REFERENCE_VERSION} (run scripts/setup)"
            )
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the ansible-core parity tests: {problem}")
        pytest.skip(problem)
    return python


def isolated_env(home: Path) -> dict[str, str]:
    """The environment ansible runs in: nothing of the user's Ansible configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    config = home / "ansible.cfg"
    config.write_text("")
    env.update(
        HOME=str(home),
        ANSIBLE_HOME=str(home / ".ansible"),
        ANSIBLE_CONFIG=str(config),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
        ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1",
        LC_ALL="C.UTF-8",
        PYTHONHASHSEED="0",
    )
    return env


def run_reference(jobs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Run the driver once over ``jobs`` (see ansible_driver.py); results by job id."""
    python = reference_python()
    with tempfile.TemporaryDirectory(prefix="gpumon-ansible-ref-") as tmp:
        home = Path(tmp)
        proc = subprocess.run(
            [str(python), str(DRIVER)],
            input=json.dumps({"jobs": jobs}),
            capture_output=True,
            text=True,
            env=isolated_env(home),
            cwd=home,
            timeout=RUN_TIMEOUT_S,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"the ansible-core driver failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)["results"]
