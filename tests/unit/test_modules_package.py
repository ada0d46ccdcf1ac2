"""package: apt/dnf state read from dpkg-query/rpm output, and the exact commands a write issues."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from deployer.connection import CommandResult, ScriptedConnection
from deployer.dpkg_arch import dpkg_instance
from deployer.modules.base import Observation
from deployer.modules.package import Package, lock_retry
from tests.dpkgdb import Instance, install_db, needs_dpkg


def observe(args: dict, stdout: str) -> tuple[Package, dict, Observation]:
    m = Package()
    a = m.validate(dict(args))
    return m, a, m.observe(a, CommandResult("read", 0, stdout, ""))


READS = [
    # (args, read stdout, expected differences)
    pytest.param(
        {"name": "curl"},
        "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=install ok installed|7.88.1-10\n",
        {},
        id="apt-present-installed",
    ),
    pytest.param(
        {"name": "curl"},
        "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=\n",
        {"curl.state": ("absent", "present")},
        id="apt-present-missing",
    ),
    pytest.param(
        {"name": "curl"},
        "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=deinstall ok config-files|7.88.1-10\n",
        {"curl.state": ("absent", "present")},
        id="apt-config-files-only-is-absent",
    ),
    pytest.param(
        {"name": "curl", "state": "absent"},
        "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=install ok installed|7.88.1-10\n",
        {"curl.state": ("present", "absent")},
        id="apt-absent-installed",
    ),
    pytest.param(
        {"name": "nvidia-fabricmanager", "version": "580.65.06-1"},
        "manager=apt\ndpkg_arch=amd64\npkg.nvidia-fabricmanager:amd64=install ok installed|575.57.08-1\n",
        {"nvidia-fabricmanager.version": ("575.57.08-1", "580.65.06-1")},
        id="apt-wrong-version",
    ),
    pytest.param(
        {"name": "nvidia-fabricmanager", "version": "580.65.06*"},
        "manager=apt\ndpkg_arch=amd64\npkg.nvidia-fabricmanager:amd64=install ok installed|580.65.06-1\n",
        {},
        id="apt-version-prefix-glob",
    ),
    pytest.param(
        {"name": ["a", "b"], "hold": True},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=hold ok installed|1\npkg.b:amd64=install ok installed|2\n",
        {"b.hold": (False, True)},
        id="apt-hold-one-of-two",
    ),
    pytest.param(
        {"name": "a", "hold": False},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=hold ok installed|1\n",
        {"a.hold": (True, False)},
        id="apt-unhold",
    ),
    pytest.param(
        {"name": "a", "state": "latest"},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1.0\ncandidate.a=1.1\n",
        {"a.latest": (False, True)},
        id="apt-latest-upgradable",
    ),
    pytest.param(
        {"name": "a", "state": "latest"},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1.1\ncandidate.a=1.1\n",
        {},
        id="apt-latest-current",
    ),
    pytest.param(
        {"name": "a", "update_cache": True, "cache_valid_time": 3600},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1\ncache_mtime=1000\nnow=9000\n",
        {"cache_fresh": (False, True)},
        id="apt-cache-stale",
    ),
    pytest.param(
        {"name": "a", "update_cache": True, "cache_valid_time": 3600},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1\ncache_mtime=8000\nnow=9000\n",
        {},
        id="apt-cache-fresh",
    ),
    pytest.param(
        {"name": "a", "update_cache": True},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1\n",
        {},
        id="apt-update-cache-alone-is-no-change",
    ),
    pytest.param(
        {"name": "nginx", "version": "1.20.1-10.el9"},
        "manager=dnf\nrpm.nginx=1:1.20.1-10.el9\n",
        {},
        id="dnf-version-without-epoch",
    ),
    pytest.param(
        {"name": "nginx", "version": "2:1.20.1-10.el9"},
        "manager=dnf\nrpm.nginx=1:1.20.1-10.el9\n",
        {"nginx.version": ("1.20.1-10.el9", "2:1.20.1-10.el9")},
        id="dnf-version-with-epoch",
    ),
    pytest.param(
        {"name": "nginx"},
        "manager=dnf\nrpm.nginx=\n",
        {"nginx.state": ("absent", "present")},
        id="dnf-missing",
    ),
    pytest.param(
        {"name": ["nvidia-driver", "nvidia-driver-libs"], "hold": True},
        "manager=dnf\nrpm.nvidia-driver=3:580.65.06-1.el9\nrpm.nvidia-driver-libs=3:580.65.06-1.el9\n"
        "lock:nvidia-driver-libs-3:580.65.06-1.el9.*\n",
        {"nvidia-driver.hold": (False, True)},
        id="dnf-versionlock-by-exact-name",
    ),
]


@pytest.mark.parametrize(("args", "stdout", "expected"), READS)
def test_read_gives_differences(args: dict, stdout: str, expected: dict) -> None:
    _, _, obs = observe(args, stdout)
    assert obs.differences == expected


def test_host_without_apt_or_dnf_is_a_read_error() -> None:
    with pytest.raises(ValueError, match="neither apt"):
        observe({"name": "a"}, "manager=none\n")


def test_read_script_detects_the_manager_and_queries_every_package_at_once() -> None:
    """dpkg-query parses dpkg's whole status file each time it runs: one run for the task."""
    m = Package()
    script = m.read_script(m.validate({"name": ["curl", "jq"]}))
    assert "command -v dpkg-query" in script and "command -v dnf" in script
    assert script.count("dpkg-query -W") == 1 and "-- curl jq 2>/dev/null || true" in script


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg (Debian)")
def test_the_read_of_real_dpkg_finds_installed_absent_and_arch_qualified_packages() -> None:
    """On this machine's own dpkg database: one installed package at its version, one dpkg
    never heard of (absent, and the read still succeeds), one named with its architecture."""
    from deployer.connection import LocalConnection

    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    version = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "dpkg"], capture_output=True, text=True
    ).stdout
    names = ["dpkg", "gpumon-no-such-package", f"libc6:{arch.stdout.strip()}"]
    m = Package()
    args = m.validate({"name": names, "version": version})
    read = LocalConnection().run(m.read_script(args))
    assert read.rc == 0, read
    actual = m.observe(args, read).actual
    assert (actual["dpkg.state"], actual["dpkg.version"]) == ("present", version)
    assert actual["gpumon-no-such-package.state"] == "absent"
    assert actual[f"{names[2]}.state"] == "present"


def test_forced_manager_skips_detection() -> None:
    m = Package()
    script = m.read_script(m.validate({"name": "curl", "manager": "dnf"}))
    assert script.startswith("m=dnf\n")


def write(args: dict, stdout: str) -> list[str]:
    m, a, obs = observe(args, stdout)
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    return conn.commands


def test_apt_install_is_noninteractive_keeps_config_and_waits_for_the_lock() -> None:
    [cmd] = write({"name": "curl"}, "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=\n")
    assert "DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=300" in cmd
    assert "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold" in cmd
    assert "install -- curl" in cmd
    assert "--allow-downgrades" not in cmd
    assert "--allow-change-held-packages" not in cmd
    assert "Could not get lock" in cmd  # bounded retry while another process holds the lock


def test_apt_exact_version_allows_downgrades() -> None:
    [cmd] = write(
        {"name": "nvidia-fabricmanager", "version": "575.57.08-1"},
        "manager=apt\ndpkg_arch=amd64\npkg.nvidia-fabricmanager:amd64=install ok installed|580.65.06-1\n",
    )
    assert "--allow-downgrades install -- nvidia-fabricmanager=575.57.08-1" in cmd


def test_apt_held_package_of_this_task_is_unheld_for_its_transaction_only() -> None:
    [cmd] = write(
        {"name": ["a", "b"], "version": "2"},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=hold ok installed|1\npkg.b:amd64=install ok installed|1\n",
    )
    assert cmd.startswith("apt-mark -o DPkg::Lock::Timeout=300 unhold -- a >/dev/null")
    assert "install -- a=2 b=2" in cmd
    assert "apt-mark -o DPkg::Lock::Timeout=300 hold -- a >/dev/null" in cmd
    assert cmd.index("unhold") < cmd.index("install --") < cmd.rindex(" hold -- a")
    assert "--allow-change-held-packages" not in cmd


def test_apt_remove_only_the_installed_ones() -> None:
    [cmd] = write(
        {"name": ["a", "b"], "state": "absent"},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1\npkg.b:amd64=\n",
    )
    assert "remove -- a 2>&1)" in cmd


def test_apt_hold_only_flips_the_differing_package() -> None:
    [cmd] = write(
        {"name": ["a", "b"], "hold": True},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=hold ok installed|1\npkg.b:amd64=install ok installed|2\n",
    )
    assert "apt-mark -o DPkg::Lock::Timeout=300 hold -- b" in cmd
    assert " a" not in cmd.split("hold --")[1].split("2>&1")[0]


def test_apt_update_cache_runs_before_an_install_and_stamps() -> None:
    cmds = write(
        {"name": "curl", "update_cache": True}, "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=\n"
    )
    assert "apt-get -q -o DPkg::Lock::Timeout=300 update" in cmds[0]
    assert "touch -- /var/lib/apt/lists/.gpumon-update-stamp" in cmds[1]
    assert "install -- curl" in cmds[2]


def test_apt_stale_cache_alone_only_updates() -> None:
    cmds = write(
        {"name": "a", "update_cache": True, "cache_valid_time": 60},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1\ncache_mtime=1\nnow=1000\n",
    )
    assert len(cmds) == 2 and " update" in cmds[0]


def test_apt_latest_after_update_reinstalls_every_named_package() -> None:
    cmds = write(
        {"name": ["a", "b"], "state": "latest", "update_cache": True},
        "manager=apt\ndpkg_arch=amd64\npkg.a:amd64=install ok installed|1\ncandidate.a=2\n"
        "pkg.b:amd64=install ok installed|1\ncandidate.b=1\n",
    )
    assert "install -- a b" in cmds[-1]


def test_no_difference_writes_nothing() -> None:
    assert (
        write(
            {"name": "curl"},
            "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=install ok installed|1\n",
        )
        == []
    )


def test_dnf_install_exact_version_and_versionlock() -> None:
    cmds = write(
        {"name": "nginx", "version": "1.22.1-1.el9", "hold": True},
        "manager=dnf\nrpm.nginx=\n",
    )
    assert cmds == [
        "dnf -y install -- nginx-1.22.1-1.el9",
        "dnf -y versionlock add -- nginx",
    ]


def test_dnf_locked_package_is_unlocked_around_its_change() -> None:
    [cmd] = write(
        {"name": "nginx", "version": "1.22.1-1.el9"},
        "manager=dnf\nrpm.nginx=0:1.20.1-1.el9\nlock:nginx-0:1.20.1-1.el9.*\n",
    )
    assert cmd.startswith("dnf -y -q versionlock delete -- nginx")
    assert cmd.endswith("dnf -y -q versionlock add -- nginx >/dev/null; exit $rc; }")


def test_failed_install_raises() -> None:
    m, a, obs = observe({"name": "curl"}, "manager=apt\ndpkg_arch=amd64\npkg.curl:amd64=\n")
    conn = ScriptedConnection().on("apt-get", rc=100, stderr="E: Unable to locate package curl")
    with pytest.raises(Exception, match="Unable to locate"):
        m.write(conn, a, obs)


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg")
def test_read_script_runs_for_real_against_this_hosts_dpkg() -> None:
    m = Package()
    a = m.validate({"name": ["dpkg", "gpumon-surely-not-installed"]})
    out = subprocess.run(["sh", "-c", m.read_script(a)], capture_output=True, text=True)
    actual = m.parse(a, CommandResult("", out.returncode, out.stdout, ""))
    assert actual["manager"] == "apt"
    assert actual["dpkg.state"] == "present" and actual["dpkg.version"]
    assert actual["gpumon-surely-not-installed.state"] == "absent"


def test_lock_retry_retries_while_locked_then_reports_the_last_output(tmp_path) -> None:
    counter = tmp_path / "n"
    counter.write_text("0")
    fake = (
        f"n=$(cat {counter}); echo $((n+1)) > {counter}; "
        f'if [ "$n" -lt 1 ]; then echo "E: Could not get lock /var/lib/dpkg/lock"; exit 100; fi; '
        "echo done"
    )
    script = lock_retry("sh -c " + _sq(fake), 10)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "done" in out.stdout
    assert counter.read_text().strip() == "2"


def test_lock_retry_gives_up_at_once_on_other_errors(tmp_path) -> None:
    script = lock_retry("sh -c " + _sq("echo 'E: broken'; exit 100"), 10)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=5)
    assert out.returncode == 100 and "E: broken" in out.stderr


def _sq(s: str) -> str:
    return shlex.quote(s)


# ---- a host with foreign architectures (real dpkg on a database of the test's own) ------------

LIB = "libnvidia-compute-595"


def read_on(db: list[Instance], args: dict, tmp_path, monkeypatch, native: str = "amd64"):
    from deployer.connection import LocalConnection

    install_db(tmp_path, monkeypatch, native, *db)
    m = Package()
    a = m.validate(dict(args))
    read = LocalConnection().run(m.read_script(a))
    assert read.rc == 0, read
    return m, a, m.observe(a, read)


@needs_dpkg
def test_a_removed_foreign_instance_listed_after_the_native_one_does_not_hide_it(
    tmp_path, monkeypatch
) -> None:
    """dpkg lists every architecture's instance, the foreign one (i386) after the native one:
    read by its last line, an installed package whose 32-bit library was removed (left as
    configuration files) read as absent, so `state: present` reinstalled it on every run and
    `state: absent` never removed it."""
    db = [
        Instance(LIB, "amd64", "595.45.04-0ubuntu1"),
        Instance(LIB, "i386", "595.45.03-0ubuntu1", status="rc"),
    ]
    _, _, obs = read_on(db, {"name": LIB, "version": "595.45.04-0ubuntu1"}, tmp_path, monkeypatch)
    assert obs.actual[f"{LIB}.state"] == "present"
    assert obs.actual[f"{LIB}.version"] == "595.45.04-0ubuntu1"
    assert obs.in_desired_state

    m, a, obs = read_on(db, {"name": LIB, "state": "absent"}, tmp_path / "b", monkeypatch)
    assert obs.differences == {f"{LIB}.state": ("present", "absent")}
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    assert f"remove -- {LIB}" in conn.commands[-1]


@needs_dpkg
def test_a_name_without_architecture_is_the_native_instance_as_apt_reads_it(
    tmp_path, monkeypatch
) -> None:
    """Only the 32-bit instance installed: the plain name (apt installs the native one) is
    absent, the name with `:i386` present at its version; the native one held, the foreign one
    not: the plain name's hold is the native one's."""
    db = [Instance(LIB, "i386", "595.45.04-0ubuntu1"), Instance("nvidia-open", "amd64", "1")]
    args = {"name": [LIB, f"{LIB}:i386"], "version": "595.45.04-0ubuntu1"}
    _, _, obs = read_on(db, args, tmp_path, monkeypatch)
    assert obs.actual[f"{LIB}.state"] == "absent"
    assert obs.actual[f"{LIB}:i386.state"] == "present"
    assert obs.differences == {
        f"{LIB}.state": ("absent", "present"),
        f"{LIB}.version": (None, "595.45.04-0ubuntu1"),
    }

    db = [Instance(LIB, "amd64", "1", status="hi"), Instance(LIB, "i386", "1")]
    _, _, obs = read_on(db, {"name": LIB, "hold": True}, tmp_path / "b", monkeypatch)
    assert obs.actual[f"{LIB}.hold"] is True and obs.in_desired_state


@needs_dpkg
def test_an_architecture_all_package_answers_for_its_plain_name(tmp_path, monkeypatch) -> None:
    db = [Instance("nvidia-kernel-source-595", "all", "595.45.04-1", multi_arch="foreign")]
    _, _, obs = read_on(db, {"name": "nvidia-kernel-source-595"}, tmp_path, monkeypatch)
    assert obs.actual["nvidia-kernel-source-595.state"] == "present"


def test_without_dpkg_s_native_architecture_the_only_instance_is_read() -> None:
    assert dpkg_instance({"a:arm64": 1}, "a", "") == 1
    assert dpkg_instance({"a:arm64": 1, "a:armhf": 2}, "a", "") is None
    assert dpkg_instance({"a:arm64": 1, "a:armhf": 2}, "a", "arm64") == 1
    assert dpkg_instance({"a:arm64": 1, "a:armhf": 2}, "a:armhf", "arm64") == 2
