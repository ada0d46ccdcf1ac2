"""deployer/rollout/availability.py: what a host's package sources offer, asked before a rollout
touches any host; refused when a package of the plan is not offered at the version it needs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deployer.connection import CommandResult, LocalConnection
from deployer.errors import HostUnreachable
from deployer.gpu.rules import PackagePin
from deployer.modules.package import STAMP_COMMAND, update_command
from deployer.rollout import availability
from deployer.rollout.availability import Offer, check, missing, parse_answer, policy_script

REPO = Path(__file__).resolve().parents[2]

OPEN = PackagePin("nvidia-open", "590.44.01", "590.44.01-1", "driver")
PINNING = PackagePin("nvidia-driver-pinning-590", None, None, "driver")
DCGM = PackagePin("datacenter-gpu-manager-4-core", "4.6.0", "1:4.6.0-1", "dcgm")

# The script's answer on a host whose NVIDIA mirror lacks 590.44.01, in apt 2.6.2's layout
# (LC_ALL=C apt-cache policy, as this machine's apt prints it: a version pinned by the role's
# apt_preferences shows its priority, 1001, on its own row only)
LAGGING = """gpumon-nvidia-source: yes
@@ dpkg --audit
@@ apt-cache policy
nvidia-open:
  Installed: 580.126.20-1
  Candidate: 580.126.20-1
  Version table:
     595.45.04-1 500
        500 http://mirror.example/cuda/debian12/x86_64  Packages
     590.48.01-1 500
        500 http://mirror.example/cuda/debian12/x86_64  Packages
 *** 580.126.20-1 1001
        500 http://mirror.example/cuda/debian12/x86_64  Packages
        100 /var/lib/dpkg/status
nvidia-driver-pinning-590:
  Installed: (none)
  Candidate: 590.48.01-1
  Version table:
     590.48.01-1 500
        500 http://mirror.example/cuda/debian12/x86_64  Packages
datacenter-gpu-manager-4-core:
  Installed: 1:4.6.0-1
  Candidate: 1:4.6.0-1
  Version table:
 *** 1:4.6.0-1 100
        100 /var/lib/dpkg/status
"""


def test_apt_cache_policy_is_read_version_by_version_with_where_each_comes_from():
    answer = parse_answer(LAGGING)
    assert (answer.configured, answer.audit) == (True, ())
    offers = answer.offers
    assert offers["nvidia-open"] == Offer(
        "580.126.20-1",
        "580.126.20-1",
        {"595.45.04-1": True, "590.48.01-1": True, "580.126.20-1": True},
    )
    assert offers["nvidia-driver-pinning-590"].installed is None
    # installed, and no source offers it any more: dpkg's status file is not a source
    assert offers["datacenter-gpu-manager-4-core"].versions == {"1:4.6.0-1": False}


@pytest.mark.skipif(shutil.which("apt-cache") is None, reason="no apt on this machine")
def test_the_script_read_on_this_machine_s_real_apt():
    """The script as a host runs it, here (this controller's own apt, Debian 12 like the lab's
    hosts): a package dpkg has installed is read with its installed version, one no source knows
    is not read at all, and the NVIDIA source is not configured on this machine."""
    bash = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "bash"], capture_output=True, text=True, check=True
    ).stdout
    pins = (
        PackagePin("bash", None, None, "driver"),
        PackagePin("no-such-package-x", "1", "1-1", "driver"),
    )
    result = LocalConnection().run(policy_script(pins), timeout=60)
    answer = parse_answer(result.stdout)
    offers = answer.offers
    assert result.rc == 0, result.stderr
    assert answer.configured is (Path("/etc/apt/sources.list.d/nvidia-cuda.sources").exists())
    assert answer.audit == ()  # this machine's dpkg has nothing half-installed
    assert offers["bash"].installed == bash and bash in offers["bash"].versions
    assert "no-such-package-x" not in offers
    assert missing(pins, offers) == ["no-such-package-x=1-1 (no source offers no-such-package-x)"]


@pytest.mark.parametrize(
    ("pin", "lacking"),
    [
        (OPEN, "nvidia-open=590.44.01-1 (offered: 595.45.04-1, 590.48.01-1, 580.126.20-1)"),
        (PackagePin("nvidia-open", "590.48.01", "590.48.01-1", "driver"), None),
        # the installed version needs no source
        (PackagePin("nvidia-open", "580.126.20", "580.126.20-1", "driver"), None),
        (DCGM, None),
        (PackagePin("datacenter-gpu-manager-4-core", "4.5.3", "1:4.5.3-1", "dcgm"),
         "datacenter-gpu-manager-4-core=1:4.5.3-1 (offered: none)"),
        # a package named without a version: any candidate will do
        (PINNING, None),
        (PackagePin("nvidia-driver-pinning-595", None, None, "driver"),
         "nvidia-driver-pinning-595 (no source offers nvidia-driver-pinning-595)"),
    ],
)  # fmt: skip
def test_what_a_host_cannot_have_is_named_with_what_it_is_offered(pin, lacking):
    assert missing([pin], parse_answer(LAGGING).offers) == ([lacking] if lacking else [])


class Host:
    """A host's answers: its policy before and after ``apt-get update``."""

    def __init__(self, before: str, after: str | None = None, update_rc: int = 0) -> None:
        self.before, self.after, self.update_rc = before, after or before, update_rc
        self.updated = False
        self.commands: list[str] = []

    def run(self, host: str, command: str, timeout: float) -> CommandResult:
        self.commands.append(command)
        if "apt-get" in command and " update" in command:
            self.updated = self.update_rc == 0
            return CommandResult(command, self.update_rc, "", "E: Failed to fetch mirror")
        if "apt-cache policy" in command:
            return CommandResult(command, 0, self.after if self.updated else self.before, "")
        if command == STAMP_COMMAND:
            return CommandResult(command, 0, "", "")
        raise AssertionError(command)


REFRESH = [update_command(availability.LOCK_TIMEOUT_S), STAMP_COMMAND]  # as the package module


OFFERS_590_44 = LAGGING.replace("     590.48.01-1 500", "     590.44.01-1 500")


def test_lists_older_than_the_sources_are_refreshed_once_then_nothing_is_refused():
    host = Host(LAGGING, after=OFFERS_590_44)
    verdict = check({"gpu01": (OPEN, PINNING)}, host.run, refresh=True)
    assert verdict.refusals == [] and verdict.notes == {}
    assert [c for c in host.commands if "apt-cache policy" not in c] == REFRESH


def test_a_version_the_sources_lack_after_the_refresh_refuses_the_host_naming_what_they_offer():
    host = Host(LAGGING)
    (refusal,) = check({"gpu01": (OPEN, PINNING, DCGM)}, host.run, refresh=True).refusals
    assert (refusal.host, refusal.rule) == ("gpu01", "package-unavailable")
    assert refusal.message == (
        "its package sources do not offer nvidia-open=590.44.01-1 (offered: 595.45.04-1, "
        "590.48.01-1, 580.126.20-1) (after apt-get update)"
    )
    assert "nothing was drained" in refusal.fix


def test_a_failed_refresh_refuses_with_apt_s_own_words():
    host = Host(LAGGING, update_rc=100)
    (refusal,) = check({"gpu01": (OPEN,)}, host.run, refresh=True).refusals
    assert "apt-get update failed: E: Failed to fetch mirror" in refusal.message
    assert STAMP_COMMAND not in host.commands  # the lists are not fresh: no stamp says they are


def test_check_mode_reads_the_lists_as_they_are_and_notes_what_they_lack():
    host = Host(LAGGING, after=OFFERS_590_44)
    verdict = check({"gpu01": (OPEN,)}, host.run, refresh=False)
    assert verdict.refusals == []
    assert verdict.notes["gpu01"].startswith("not in its package lists: nvidia-open=590.44.01-1")
    assert not any("update" in c for c in host.commands)


def test_a_host_whose_nvidia_source_is_not_configured_yet_is_not_judged():
    host = Host(LAGGING.replace("source: yes", "source: no"))
    verdict = check({"gpu01": (OPEN,)}, host.run, refresh=True)
    assert verdict.refusals == [] and "not configured yet" in verdict.notes["gpu01"]
    assert not any("update" in c for c in host.commands)


def test_a_host_that_cannot_be_asked_is_refused():
    def unreachable(host: str, command: str, timeout: float) -> CommandResult:
        raise HostUnreachable("gpu01: connection refused")

    def silent(host: str, command: str, timeout: float) -> CommandResult:
        return CommandResult(command, 0, "", "")

    for run, said in ((unreachable, "connection refused"), (silent, "could not be read")):
        (refusal,) = check({"gpu01": (OPEN,)}, run, refresh=True).refusals
        assert said in refusal.message


def test_the_nvidia_source_asked_for_is_the_one_the_driver_role_writes():
    tasks = yaml.safe_load((REPO / "roles/nvidia_driver/tasks/main.yml").read_text())
    names = [t["apt_repository"]["name"] for t in tasks if "apt_repository" in t]
    assert names == [availability.NVIDIA_SOURCE]


# dpkg --audit (Debian 12's dpkg, LC_ALL=C) on a lab host where a package (built there, described
# "t") was unpacked and never configured, as an interrupted install leaves one
UNPACKED = """The following packages have been unpacked but not yet configured.
They must be configured using dpkg --configure or the configure
menu option in dselect for them to work:
 gpumon-test-broken   t

"""


@pytest.mark.parametrize("refresh", [True, False], ids=["run", "check"])
def test_a_host_dpkg_left_half_installed_is_refused_naming_the_packages(refresh):
    host = Host(LAGGING.replace("@@ dpkg --audit\n", "@@ dpkg --audit\n" + UNPACKED))
    (refusal,) = check({"gpu01": (OPEN,)}, host.run, refresh=refresh).refusals
    assert refusal.rule == "dpkg-unfinished"
    assert refusal.message == (
        "dpkg has not finished installing gpumon-test-broken (dpkg --audit: The following "
        "packages have been unpacked but not yet configured.)"
    )
    assert "dpkg --configure -a" in refusal.fix
    assert not any("update" in c for c in host.commands)  # nothing else asked
