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
def _shard_layout_records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Re-shard records (deployer/monitoring/handoff.py) of this test session only: a layout
    recorded by an earlier session, or by a user of this machine, never hands over here. Every
    ``gpumon-deploy`` a test starts inherits it."""
    from deployer.monitoring import handoff

    before = os.environ.get(handoff.RECORD_DIR_ENV)
    os.environ[handoff.RECORD_DIR_ENV] = str(tmp_path_factory.mktemp("shard-records"))
    yield
    if before is None:
        os.environ.pop(handoff.RECORD_DIR_ENV, None)
    else:
        os.environ[handoff.RECORD_DIR_ENV] = before
