"""Unit tests never touch this machine's /var/lib/gpumon-deploy: owed handlers go to a tmp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer import owed


@pytest.fixture(autouse=True)
def owed_handlers_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    directory = tmp_path_factory.mktemp("owed") / "owed-handlers"
    monkeypatch.setattr(owed, "OWED_DIR", str(directory))
    return directory
