"""deployer/rollout/free_space.py: a GPU host with too little room for its driver install is
refused before the rollout touches any host (dpkg, DKMS and update-initramfs fail half-way on a
full filesystem, the host already drained); ``nvidia_driver_min_free_mib`` says what is needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from deployer.connection import CommandResult, LocalConnection
from deployer.errors import InputError
from deployer.gpu import gpu_plan
from deployer.gpu.rules import PackagePin
from deployer.modules import disk_space
from deployer.modules.disk_space import Room
from deployer.rollout import availability, free_space

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
OPEN = PackagePin("nvidia-open", "580.126.20", "580.126.20-1", "driver")


def test_free_space_is_read_with_df_on_this_machine_path_by_path():
    """The script as a host runs it, here: each path that exists with its filesystem's mount
    point and the bytes an unprivileged user may write (statvfs' f_bavail), a missing one not
    at all."""
    paths = ["/var", "/usr", "/tmp", "/no/such/path"]
    result = LocalConnection().run(free_space.script(paths), timeout=60)
    lines = result.stdout.splitlines()
    assert lines[0] == free_space.MARK
    rooms = disk_space.parse(lines[1:])
    assert sorted(rooms) == ["/tmp", "/usr", "/var"]
    for path, room in rooms.items():
        seen = os.statvfs(path)
        assert abs(room.free_bytes - seen.f_bavail * seen.f_frsize) < 256 * MIB, path
        assert os.stat(room.mount).st_dev == os.stat(path).st_dev  # its filesystem's mount
    same = os.stat("/var").st_dev == os.stat("/usr").st_dev
    assert (rooms["/var"].mount == rooms["/usr"].mount) is same


def test_df_s_header_and_lines_of_another_shape_are_passed_over():
    rooms = disk_space.parse(
        ["File        Avail Mounted on", "/var  8123 /", "/boot 100 /boot efi", "garbage", ""]
    )
    assert rooms == {"/var": Room("/", 8123), "/boot": Room("/boot efi", 100)}


NEEDS = {"/var": 2048, "/usr": 2048, "/boot": 128}


@pytest.mark.parametrize(
    ("rooms", "short"),
    [
        # one filesystem holds all three: it needs their sum
        ({p: Room("/", 4224 * MIB) for p in NEEDS}, []),
        ({p: Room("/", 4223 * MIB) for p in NEEDS},
         ["/var and /usr and /boot (on /): 4223 MiB free, 4224 MiB needed"]),
        # a /boot of its own, filled by old kernels' images, judged alone
        ({"/var": Room("/", 4096 * MIB), "/usr": Room("/", 4096 * MIB),
          "/boot": Room("/boot", 90 * MIB)},
         ["/boot (on /boot): 90 MiB free, 128 MiB needed"]),
        # a path the host does not have is not asked
        ({"/var": Room("/var", 2048 * MIB), "/usr": Room("/", 2048 * MIB)}, []),
    ],
)  # fmt: skip
def test_each_filesystem_needs_the_sum_of_its_paths_needs(rooms, short):
    assert disk_space.shortfalls(NEEDS, rooms) == short


def test_the_role_s_defaults_are_the_needs_a_host_gets():
    defaults = yaml.safe_load((REPO / "roles/nvidia_driver/defaults/main.yml").read_text())
    assert gpu_plan.min_free_mib("g1", defaults) == NEEDS


@pytest.mark.parametrize(
    ("value", "needs"),
    [
        (None, {}),
        (False, {}),
        ({}, {}),
        ({"/var": 0, "/usr": 512}, {"/usr": 512}),  # a path at 0 is not asked
    ],
)
def test_the_needs_are_read_from_nvidia_driver_min_free_mib(value, needs):
    assert gpu_plan.min_free_mib("g1", {"nvidia_driver_min_free_mib": value}) == needs


@pytest.mark.parametrize(
    ("value", "key", "said"),
    [
        ("2048", "nvidia_driver_min_free_mib", "is not a mapping of paths to MiB"),
        (["/var"], "nvidia_driver_min_free_mib", "is not a mapping of paths to MiB"),
        ({"var": 1}, "nvidia_driver_min_free_mib.var", "is not an absolute path"),
        ({"/var; rm -rf /": 1}, "nvidia_driver_min_free_mib./var; rm -rf /", "absolute path"),
        ({"/var": -1}, "nvidia_driver_min_free_mib./var", "is not a whole number of MiB"),
        ({"/var": True}, "nvidia_driver_min_free_mib./var", "is not a whole number of MiB"),
        ({"/var": 1.5}, "nvidia_driver_min_free_mib./var", "is not a whole number of MiB"),
        ({"/var": "2G"}, "nvidia_driver_min_free_mib./var", "is not a whole number of MiB"),
    ],
)
def test_bad_needs_are_refused_naming_the_host_and_the_key(value, key, said):
    with pytest.raises(InputError) as err:
        gpu_plan.check_role_vars("g1", {"nvidia_driver_min_free_mib": value})
    assert err.value.key == key
    assert "host g1: " in str(err.value) and said in str(err.value)


class Host:
    """A host answering the availability script: its package sources offer the plan, dpkg has
    nothing half-installed, and df says ``df``."""

    def __init__(self, df: list[str]) -> None:
        self.df = df
        self.commands: list[str] = []

    def run(self, host: str, command: str, timeout: float) -> CommandResult:
        self.commands.append(command)
        assert "apt-cache policy" in command, command
        out = [f"{availability.SOURCE_MARK} yes"]
        if free_space.MARK in command:
            out += [free_space.MARK, "File        Avail Mounted on", *self.df]
        out += [
            availability.AUDIT_MARK,
            availability.POLICY_MARK,
            "nvidia-open:",
            "  Installed: (none)",
            "  Candidate: 580.126.20-1",
            "  Version table:",
            "     580.126.20-1 500",
            "        500 http://repo.example/cuda/debian12/x86_64  Packages",
        ]
        return CommandResult(command, 0, "\n".join(out) + "\n", "")


FULL_BOOT = [f"/var {8 << 30} /", f"/usr {8 << 30} /", f"/boot {40 * MIB} /boot"]


@pytest.mark.parametrize("refresh", [True, False], ids=["run", "check"])
def test_a_host_with_too_little_room_is_refused_before_anything_also_in_check_mode(refresh):
    host = Host(FULL_BOOT)
    (refusal,) = availability.check(
        {"gpu01": (OPEN,)}, host.run, refresh=refresh, space={"gpu01": NEEDS}
    ).refusals
    assert (refusal.host, refusal.rule) == ("gpu01", "disk-space")
    assert refusal.message == (
        "too little free space for the driver's install: /boot (on /boot): 40 MiB free, "
        "128 MiB needed"
    )
    assert "nvidia_driver_min_free_mib" in refusal.fix and "nothing was drained" in refusal.fix
    # asked in the same round trip as the package sources, and nothing else
    (command,) = host.commands
    assert "df -B1 --output=file,avail,target -- /var /usr /boot" in command


def test_a_host_with_room_is_not_refused_and_one_asked_for_nothing_gets_no_df():
    roomy = Host([f"/var {8 << 30} /", f"/usr {8 << 30} /", f"/boot {1 << 30} /boot"])
    verdict = availability.check(
        {"gpu01": (OPEN,)}, roomy.run, refresh=True, space={"gpu01": NEEDS}
    )
    assert verdict.refusals == [] and verdict.notes == {}
    unasked = Host(FULL_BOOT)
    assert availability.check({"gpu01": (OPEN,)}, unasked.run, refresh=True).refusals == []
    assert " df " not in unasked.commands[0]
