"""``disk_space``: room for an install on the filesystems of some paths, read with df through
the executor on this machine's shell; never a change, a failure says where and how much."""

from __future__ import annotations

import os
from typing import Any

import pytest

from deployer.connection import LocalConnection
from deployer.executor import Executor
from deployer.modules.base import Module
from deployer.modules.disk_space import MIB, DiskSpace
from deployer.plan import HostPlan, HostPlay, PlannedTask
from deployer.results import Status
from deployer.roles import Play

PLAY = Play(name="p", hosts="all", roles=("r",))
HINT = "free space there, or set nvidia_driver_min_free_mib"


def planned(module: Module, args: dict[str, Any]) -> PlannedTask:
    return PlannedTask("r", "room", module, module.validate(args), "tasks.yml", 1)


def converge(needs: dict[str, int], check: bool = False):
    args = {"needs": needs, "purpose": "driver 595.45.04's install", "hint": HINT}
    plan = HostPlan("h1", [HostPlay(PLAY, [planned(DiskSpace(), args)], {}, [])])
    report = Executor(lambda h: LocalConnection(h), check=check).run([plan], (PLAY,))
    (result,) = report.hosts["h1"].tasks
    return result


def free_mib(path: str) -> int:
    seen = os.statvfs(path)
    return seen.f_bavail * seen.f_frsize // MIB


def test_room_enough_is_ok_and_never_a_change(tmp_path):
    result = converge({str(tmp_path): 1})
    assert (result.status, result.wrote) == (Status.OK, False)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_too_little_room_fails_naming_the_path_its_filesystem_and_both_figures(tmp_path, check):
    need = free_mib(str(tmp_path)) + (1 << 20)  # a TiB more than there is
    result = converge({str(tmp_path): need}, check=check)
    assert result.status == Status.FAILED and not result.wrote
    assert result.error.startswith(
        f"too little free space for driver 595.45.04's install: {tmp_path} (on "
    )
    assert f" MiB free, {need} MiB needed; {HINT}" in result.error


def test_paths_on_one_filesystem_need_the_sum_of_their_needs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    half = free_mib(str(tmp_path)) // 2 + 64  # each alone fits, both together do not
    alone = converge({str(tmp_path / "a"): half})
    assert alone.status == Status.OK
    both = converge({str(tmp_path / "a"): half, str(tmp_path / "b"): half})
    assert both.status == Status.FAILED
    assert f"{tmp_path / 'a'} and {tmp_path / 'b'} (on " in both.error


def test_a_path_the_host_lacks_or_a_need_of_zero_is_not_asked(tmp_path):
    assert converge({str(tmp_path / "absent"): 1 << 40}).status == Status.OK
    assert converge({str(tmp_path): 0}).status == Status.OK
    assert converge({}).status == Status.OK
