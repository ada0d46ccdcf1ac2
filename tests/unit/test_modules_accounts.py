"""user and group: state from getent/id, and the useradd/usermod/groupadd commands a write issues."""

from __future__ import annotations

import subprocess

import pytest

from deployer.connection import CommandResult, ScriptedConnection
from deployer.modules.accounts import Group, User


def run(module, args: dict, stdout: str):
    a = module.validate(dict(args))
    obs = module.observe(a, CommandResult("read", 0, stdout, ""))
    conn = ScriptedConnection()
    module.write(conn, a, obs)
    return obs, conn.commands


PROM = "passwd=prometheus:x:998:998:Prometheus:/var/lib/prometheus:/usr/sbin/nologin\n"

USER_CASES = [
    pytest.param(
        {"name": "prometheus", "system": True, "home": "/var/lib/prometheus"},
        "passwd=\n",
        {
            "state": ("absent", "present"),
            "home": (None, "/var/lib/prometheus"),
            "shell": (None, "/usr/sbin/nologin"),
        },
        [
            "useradd --system --home-dir /var/lib/prometheus --shell /usr/sbin/nologin "
            "--user-group --no-create-home -- prometheus"
        ],
        id="create-system-user",
    ),
    pytest.param(
        {"name": "prometheus", "comment": "Prometheus", "home": "/var/lib/prometheus"},
        PROM + "primary=prometheus\ngroups=prometheus\n",
        {},
        [],
        id="in-place",
    ),
    pytest.param(
        {"name": "prometheus", "groups": ["video"]},
        PROM + "primary=prometheus\ngroups=prometheus\n",
        {"groups": ([], ["video"])},
        ["usermod --groups video -- prometheus"],
        id="add-supplementary-group",
    ),
    pytest.param(
        {"name": "prometheus", "groups": ["video"], "append": True},
        PROM + "primary=prometheus\ngroups=prometheus video render\n",
        {},
        [],
        id="append-already-member",
    ),
    pytest.param(
        {"name": "prometheus", "groups": []},
        PROM + "primary=prometheus\ngroups=prometheus render\n",
        {"groups": (["render"], [])},
        ["usermod --groups '' -- prometheus"],
        id="exact-empty-set-removes-groups",
    ),
    pytest.param(
        {"name": "prometheus", "shell": "/bin/bash", "uid": 1500},
        PROM + "primary=prometheus\ngroups=prometheus\n",
        {"shell": ("/usr/sbin/nologin", "/bin/bash"), "uid": (998, 1500)},
        ["usermod --uid 1500 --shell /bin/bash -- prometheus"],
        id="modify-uid-and-shell",
    ),
    pytest.param(
        {"name": "prometheus", "state": "absent"},
        PROM + "primary=prometheus\ngroups=prometheus\n",
        {"state": ("present", "absent")},
        ["userdel -- prometheus"],
        id="remove",
    ),
]


@pytest.mark.parametrize(("args", "stdout", "diffs", "commands"), USER_CASES)
def test_user(args: dict, stdout: str, diffs: dict, commands: list[str]) -> None:
    obs, issued = run(User(), args, stdout)
    assert obs.differences == diffs
    assert issued == commands


GROUP_CASES = [
    pytest.param(
        {"name": "gpumon", "system": True, "gid": 990},
        "group=\n",
        ["groupadd --system --gid 990 -- gpumon"],
        id="create",
    ),
    pytest.param({"name": "gpumon"}, "group=gpumon:x:990:\n", [], id="in-place"),
    pytest.param(
        {"name": "gpumon", "gid": 991},
        "group=gpumon:x:990:\n",
        ["groupmod --gid 991 -- gpumon"],
        id="change-gid",
    ),
    pytest.param(
        {"name": "gpumon", "state": "absent"},
        "group=gpumon:x:990:\n",
        ["groupdel -- gpumon"],
        id="remove",
    ),
]


@pytest.mark.parametrize(("args", "stdout", "commands"), GROUP_CASES)
def test_group(args: dict, stdout: str, commands: list[str]) -> None:
    _, issued = run(Group(), args, stdout)
    assert issued == commands


def test_user_read_script_runs_for_real_for_root() -> None:
    m = User()
    a = m.validate({"name": "root"})
    out = subprocess.run(["sh", "-c", m.read_script(a)], capture_output=True, text=True)
    actual = m.parse(a, CommandResult("", out.returncode, out.stdout, ""))
    assert actual["uid"] == 0 and actual["group"] == "root" and actual["home"] == "/root"


def test_user_read_script_for_a_missing_user_reports_absent() -> None:
    m = User()
    a = m.validate({"name": "gpumon-no-such-user"})
    out = subprocess.run(["sh", "-c", m.read_script(a)], capture_output=True, text=True)
    assert m.parse(a, CommandResult("", 0, out.stdout, "")) == {"state": "absent"}


def test_group_read_script_runs_for_real() -> None:
    m = Group()
    a = m.validate({"name": "root"})
    out = subprocess.run(["sh", "-c", m.read_script(a)], capture_output=True, text=True)
    assert m.parse(a, CommandResult("", 0, out.stdout, "")) == {"state": "present", "gid": 0}
