"""Shared pytest fixtures: the lab, brought up once per test session.

The ``lab`` fixture brings the default lab (or the lab named by ``GPUMON_LAB_NAME``) up (or reuses one already running: ``lab up`` is
idempotent), yields the ``deployer.lab.Lab``, and takes it down at the end of the session unless
``GPUMON_LAB_KEEP=1``.  Tests that use it are marked ``@pytest.mark.lab``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from deployer.lab import Lab


def lab_unavailable_reason() -> str | None:
    """Why the lab cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "the lab needs root (systemd-nspawn, a bridge, overlay mounts)"
    for tool in ("systemd-nspawn", "debootstrap", "dpkg-scanpackages", "gpg", "ip", "ssh"):
        if shutil.which(tool) is None:
            return f"the lab needs {tool} (run scripts/setup)"
    return None


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    reason = lab_unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the lab tests: {reason}")
        pytest.skip(reason)
    the_lab = Lab(os.environ.get("GPUMON_LAB_NAME") or "default")
    the_lab.up()
    yield the_lab
    if os.environ.get("GPUMON_LAB_KEEP") != "1":
        the_lab.down()


@pytest.fixture(scope="session", autouse=True)
def _controller_state_of_this_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Re-shard records (deployer/monitoring/handoff.py) and run locks (deployer/run_lock.py) of
    this test session only: a layout recorded by an earlier session, or by a user of this
    machine, never hands over here, and no lock of theirs refuses a run here. Every
    ``gpumon-deploy`` a test starts inherits them."""
    from deployer import run_lock
    from deployer.monitoring import handoff

    names = (handoff.RECORD_DIR_ENV, run_lock.LOCK_DIR_ENV)
    before = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ[name] = str(tmp_path_factory.mktemp(name.lower()))
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
