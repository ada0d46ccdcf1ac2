"""``assert`` (a read-only check: never a change, a failure says why) and
``nvidia_driver_switch`` (one apt transaction from the GPU plan, proven by reading dpkg again),
through the executor on this machine's shell."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.connection import CommandResult, LocalConnection, ScriptedConnection
from deployer.executor import Executor
from deployer.modules.assertion import Assert
from deployer.modules.base import ArgError, Module
from deployer.modules.driver_switch import DriverSwitch, package_state
from deployer.modules.files import Directory
from deployer.plan import HostPlan, HostPlay, PlannedTask
from deployer.results import Status
from deployer.roles import Play
from tests.dpkgdb import Instance, install_db, needs_dpkg

PLAY = Play(name="p", hosts="all", roles=("r",))


def planned(module: Module, args: dict[str, Any], name: str = "t") -> PlannedTask:
    return PlannedTask("r", name, module, module.validate(args), "tasks.yml", 1)


def converge(*tasks: PlannedTask, check: bool = False):
    plan = HostPlan("h1", [HostPlay(PLAY, list(tasks), {}, [])])
    report = Executor(lambda h: LocalConnection(h), check=check).run([plan], (PLAY,))
    return report.hosts["h1"].tasks


def test_a_passing_assertion_is_ok_and_never_a_change(tmp_path):
    (result,) = converge(planned(Assert(), {"that": f"test -d {tmp_path}"}))
    assert (result.status, result.wrote) == (Status.OK, False)


def test_a_failing_assertion_fails_with_what_explain_prints(tmp_path):
    (result,) = converge(
        planned(Assert(), {"that": "false", "explain": "echo 'reboot required: 570 loaded' >&2"})
    )
    assert result.status == Status.FAILED
    assert result.error == "reboot required: 570 loaded"


def test_without_explain_a_failing_assertion_says_what_the_check_printed():
    (result,) = converge(planned(Assert(), {"that": "echo 'sees 3 GPUs, expected 4' >&2; false"}))
    assert result.status == Status.FAILED and "sees 3 GPUs, expected 4" in result.error


def test_check_mode_fails_an_assertion_the_host_fails_now():
    (result,) = converge(planned(Assert(), {"that": "false"}), check=True)
    assert result.status == Status.FAILED


def test_check_mode_only_predicts_an_assertion_after_a_predicted_change(tmp_path):
    make = planned(Directory(), {"path": str(tmp_path / "new"), "mode": "0755"}, "dir")
    verify = planned(Assert(), {"that": f"test -d {tmp_path / 'new'}"}, "verified")
    results = converge(make, verify, check=True)
    assert [r.status for r in results] == [Status.CHANGED, Status.OK]
    assert results[1].predicted and not (tmp_path / "new").exists()


def test_an_assertion_runs_with_its_environment():
    (result,) = converge(
        planned(Assert(), {"that": 'test "$WANT" = 8', "environment": {"WANT": 8}})
    )
    assert result.status == Status.OK


# ---- nvidia_driver_switch ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "present", "held"),
    [("ii ", True, False), ("hi ", True, True), ("rc ", True, False), ("un ", False, False),
     ("pn ", False, False), ("", False, False), ("iU ", True, False)],
)  # fmt: skip
def test_dpkg_status_abbreviations_say_present_and_held(status, present, held):
    assert package_state(status) == (present, held)


def test_the_switch_refuses_an_install_without_an_exact_version():
    with pytest.raises(ArgError, match="name=version"):
        DriverSwitch().validate({"install": ["nvidia-open"]})
    with pytest.raises(ArgError, match="nothing to switch"):
        DriverSwitch().validate({})


@needs_dpkg
def test_the_read_script_asks_dpkg_once_for_every_package_named(tmp_path, monkeypatch):
    m = DriverSwitch()
    args = m.validate(
        {"install": ["nvidia-open=580.126.20-1"], "purge": ["cuda-drivers-535"],
         "unhold": ["cuda-drivers-535", "nvidia-open"]}
    )  # fmt: skip
    install_db(
        tmp_path, monkeypatch, "amd64", Instance("cuda-drivers-535", "amd64", "535.54.03-1", "hi")
    )
    obs = m.observe(args, LocalConnection("h1").run(m.read_script(args)))
    assert obs.actual == {
        "installed": ["cuda-drivers-535"],
        "held": ["cuda-drivers-535"],
        "versions": {"nvidia-open": None},
    }
    assert set(obs.differences) == {"installed", "held", "versions"}


def test_a_purge_only_switch_removes_without_updating_the_lists():
    m = DriverSwitch()
    args = m.validate({"purge": ["nvidia-driver-pinning-580"]})
    obs = m.observe(
        args,
        CommandResult(
            "", 0, "dpkg_arch=amd64\nnvidia-driver-pinning-580:amd64\tii \t580.126.20-1\n", ""
        ),
    )
    conn = ScriptedConnection()
    m.write(conn, args, obs)
    (cmd,) = conn.commands
    assert "install -- nvidia-driver-pinning-580- " in cmd and "--purge" in cmd
    assert " update" not in cmd and "apt-mark" not in cmd


def test_a_switch_whose_packages_are_gone_and_unheld_is_in_its_desired_state():
    m = DriverSwitch()
    args = m.validate(
        {"install": ["nvidia-open=580.126.20-1"], "purge": ["cuda-drivers-535"],
         "unhold": ["cuda-drivers-535"]}
    )  # fmt: skip
    read = "dpkg_arch=amd64\ncuda-drivers-535:amd64\tun \t\nnvidia-open:amd64\thi \t580.126.20-1\n"
    assert m.observe(args, CommandResult("", 0, read, "")).in_desired_state


@needs_dpkg
def test_every_architecture_s_instance_of_an_old_branch_is_purged_and_unheld_by_its_name(
    tmp_path, monkeypatch
):
    """A host with i386 enabled keeps the old branch's 32-bit library beside the 64-bit one (one
    held, the other left as configuration files): both are the old branch, and apt removes and
    unholds only the native instance of a plain name, so the foreign one is named
    `:i386`. The new branch's version is its native instance's, though a 32-bit instance at
    another version is listed after it."""
    m = DriverSwitch()
    args = m.validate(
        {"install": ["libnvidia-compute-595=595.45.04-1"],
         "purge": ["libnvidia-compute-535"], "unhold": ["libnvidia-compute-535"]}
    )  # fmt: skip
    install_db(
        tmp_path, monkeypatch, "amd64",
        Instance("libnvidia-compute-535", "amd64", "535.288.01-1", "ii"),
        Instance("libnvidia-compute-535", "i386", "535.288.01-1", "hi"),
        Instance("libnvidia-compute-595", "amd64", "595.45.04-1", "ii"),
        Instance("libnvidia-compute-595", "i386", "595.45.03-1", "rc"),
    )  # fmt: skip
    obs = m.observe(args, LocalConnection("h1").run(m.read_script(args)))
    assert obs.actual == {
        "installed": ["libnvidia-compute-535", "libnvidia-compute-535:i386"],
        "held": ["libnvidia-compute-535:i386"],
        "versions": {"libnvidia-compute-595": "595.45.04-1"},
    }
    steps = m.transaction(args, obs)
    assert "apt-mark unhold -- libnvidia-compute-535:i386 " in steps
    assert "libnvidia-compute-535- libnvidia-compute-535:i386-" in steps

    # gone (the 32-bit one left as configuration files counts: purge removes those too)
    install_db(
        tmp_path / "after", monkeypatch, "amd64",
        Instance("libnvidia-compute-595", "amd64", "595.45.04-1", "ii"),
    )  # fmt: skip
    assert m.observe(args, LocalConnection("h1").run(m.read_script(args))).in_desired_state
