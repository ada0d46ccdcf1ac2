"""``upgrade-driver`` as a command over a scripted fleet: ``--check`` exits as the run would."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deployer.cli import cli
from deployer.modules.package import update_command
from deployer.roles import load_site
from deployer.rollout import availability
from deployer.session import DEFAULT_SITE, DeploySession, RunOptions
from tests.unit.gpufleet import FakeFleet, gpu_facts, policy_answer, write_inventory


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("GPUMON_ROLLOUT_STATE_DIR", str(runs))
    return runs


def upgrade(inv, *args):
    return CliRunner().invoke(cli, ["upgrade-driver", "-i", str(inv), *args])


def refused_to_580(inv) -> list[str]:
    """``upgrade-driver --to 580`` in check mode and in a run, each refused (exit 2): what each
    said, its lines joined."""
    said = []
    for mode in ("--check", "--drain=none"):
        result = upgrade(inv, "--to", "580", mode)
        assert result.exit_code == 2, result.output
        said.append(" ".join(result.output.split()))
    return said


def test_check_exits_1_when_its_only_host_cannot_be_read(tmp_path, monkeypatch, state_dir):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    FakeFleet(refused={"g1"}).install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check")
    assert result.exit_code == 1, result.output
    assert "UNREACHABLE g1" in result.output and "host key changed" in result.output
    assert not state_dir.exists() or list(state_dir.iterdir()) == []


def test_check_exits_1_when_one_of_several_hosts_cannot_be_read(tmp_path, monkeypatch, state_dir):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    FakeFleet(facts={"g1": gpu_facts("g1")}, refused={"g2"}).install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check", "--output", "json")
    assert result.exit_code == 1, result.output
    assert "UNREACHABLE g2" in result.output


def test_check_exits_2_when_its_only_host_is_refused_by_the_matrix(
    tmp_path, monkeypatch, state_dir
):
    inv = write_inventory(tmp_path, {"g4": {"gpu_model": "V100"}})
    FakeFleet(facts={"g4": gpu_facts("g4", model="V100")}).install(monkeypatch)
    result = upgrade(inv, "--to", "595", "--check")
    assert result.exit_code == 2, result.output
    assert "REFUSED g4" in result.output and "arch-last-branch" in result.output


def test_check_of_a_readable_fleet_exits_0_with_the_plan(tmp_path, monkeypatch, state_dir):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    FakeFleet(facts={"g1": gpu_facts("g1")}).install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check", "--output", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output[result.output.index("{") :])
    assert plan["batches"] == [["g1"]]
    assert not state_dir.exists() or list(state_dir.iterdir()) == []


def test_the_run_keeps_what_the_inventory_says_beside_the_target(tmp_path, monkeypatch):
    from deployer.rollout.host_targets import run_preflight

    inv = write_inventory(
        tmp_path, {"g1": {"gpu_model": "H100", "nvidia_driver_version": "580.65.06"}}
    )
    FakeFleet(facts={"g1": gpu_facts("g1")}).install(monkeypatch)
    pre = run_preflight(DeploySession.load(RunOptions(inventory=inv), plan=False), "580")
    try:
        g1 = pre.hosts["g1"]
        assert g1.inventory_driver == {"version": "580.65.06", "branch": None}
        assert g1.after["driver_version"] == "580.126.20"
    finally:
        pre.session.pool.close_all()


def loads_of_a_run(tmp_path, hosts: int) -> dict[str, int]:
    """upgrade-driver over ``hosts`` scripted GPU hosts in one batch: how often the inventory,
    the site and each role were loaded, and how many converges ran (each host is planned and
    converged once, then fails at its first task: a scripted host answers every read empty)."""
    import deployer.inventory as inventory_module
    from deployer import plan as plan_module
    from deployer import session as session_module

    names = {f"g{i:02d}": {"gpu_model": "H100"} for i in range(hosts)}
    inv = write_inventory(tmp_path, names)
    counts = {"inventory": 0, "site": 0, "roles": 0, "converges": 0}
    with pytest.MonkeyPatch.context() as mp:
        FakeFleet(facts={h: gpu_facts(h) for h in names}).install(mp)

        def counting(name, module, attr):
            original = getattr(module, attr)

            def counted(*args, **kwargs):
                counts[name] += 1
                return original(*args, **kwargs)

            mp.setattr(module, attr, counted)

        counting("inventory", inventory_module, "load_inventory")
        counting("site", session_module, "load_site")
        counting("roles", plan_module, "load_role")
        counting("converges", session_module.DeploySession, "converge_hosts")
        result = upgrade(
            inv, "--to", "580", "--canary", "0", "--batch-size", "100%",
            "--max-failures", str(hosts + 1),
        )  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    return counts


def test_upgrade_driver_loads_inventory_site_and_roles_once_whatever_the_fleet_size(
    tmp_path, monkeypatch, state_dir
):
    (tmp_path / "three").mkdir()
    (tmp_path / "thirty").mkdir()
    three = loads_of_a_run(tmp_path / "three", 3)
    thirty = loads_of_a_run(tmp_path / "thirty", 30)
    assert (three["converges"], thirty["converges"]) == (3, 30)  # every host converged
    assert three["inventory"] == thirty["inventory"] == 1
    assert three["site"] == thirty["site"] == 1
    assert three["roles"] == thirty["roles"]  # each role of the site once
    assert three["roles"] == len({r for p in load_site(DEFAULT_SITE) for r in p.roles})


SUDO = "the facts script stopped before its 'os' section (exit 1): sudo: a password is required"


def test_check_exits_1_naming_a_host_whose_facts_script_did_not_finish(
    tmp_path, monkeypatch, state_dir
):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    FakeFleet(facts={"g1": gpu_facts("g1")}, unread={"g2": SUDO}).install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check")
    assert result.exit_code == 1, result.output
    assert f"FAILED (its facts could not be read) g2: {SUDO}" in result.output
    assert "UNREACHABLE" not in result.output


def test_the_matrix_check_and_facts_fail_a_host_whose_facts_could_not_be_read(
    tmp_path, monkeypatch
):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    FakeFleet(facts={"g1": gpu_facts("g1")}, unread={"g2": SUDO}).install(monkeypatch)
    check = CliRunner().invoke(
        cli, ["check", "-i", str(inv), "--out-of-service", "--output", "json"]
    )
    assert check.exit_code == 1, check.output
    shown = json.loads(check.stdout)
    assert not shown["ok"] and shown["facts_unread"] == {"g2": SUDO}
    assert shown["unreachable"] == {}
    facts = CliRunner().invoke(cli, ["facts", "-i", str(inv)])
    assert facts.exit_code == 1, facts.output
    assert f"g2: FAILED its facts could not be read: {SUDO}" in facts.output
    assert "g1: " in facts.output


# ---------------------------------------------------------------- hosts an earlier run left


def left_run(state_dir, inv, run_id: str, hosts: dict[str, str], status: str = "running"):
    """The record of a run whose controller died (no lock held) with ``hosts`` at their steps."""
    run = state_dir / run_id
    run.mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({
        "status": status, "inventory": str(inv.resolve()),
        "hosts": {h: {"state": step} for h, step in hosts.items()},
    }))  # fmt: skip
    return run


LEFT_RUN = "20261205T100000Z-580.126.20-ab12"


@pytest.mark.parametrize("drain", ["kubernetes", "command"])
def test_a_new_run_over_hosts_an_earlier_run_left_drained_is_refused_before_any_contact(
    tmp_path, monkeypatch, state_dir, drain
):
    # A Kubernetes cordon (or a command hook's drain) keeps no owner: a new run would find g1
    # drained "before the run", upgrade it and leave it cordoned for good.
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    fleet = FakeFleet(facts={h: gpu_facts(h) for h in ("g1", "g2")}).install(monkeypatch)
    run = left_run(state_dir, inv, LEFT_RUN, {"g1": "rebooting", "g2": "done"})
    args = ["--drain-command", "drain-node {action} {host}"] if drain == "command" else []
    result = upgrade(inv, "--to", "580", "--drain", drain, *args)
    assert result.exit_code == 2, result.output
    assert f"run {LEFT_RUN} died mid-run (no controller drives it) and left g1 (rebooting)" in (
        result.output
    )
    assert f"--resume {LEFT_RUN}" in result.output and str(run) in result.output
    assert f"a {drain} drain keeps no owner" in result.output
    assert fleet.conns == {}  # no host contacted
    assert sorted(p.name for p in state_dir.iterdir()) == [LEFT_RUN]  # no new run


def test_hosts_an_earlier_run_left_stop_only_a_run_that_selects_them(tmp_path, state_dir):
    from deployer.errors import InputError
    from deployer.rollout.command import UpgradeRequest, _refuse_hosts_left

    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    req = UpgradeRequest(inventory=inv, to="580")
    left_run(state_dir, inv, LEFT_RUN, {"g1": "installing"}, status="interrupted")
    with pytest.raises(InputError, match=f"run {LEFT_RUN} was interrupted"):
        _refuse_hosts_left(req, ["g1", "g2"], "kubernetes")
    _refuse_hosts_left(req, ["g2"], "kubernetes")  # --limit g2: g1 is not this run's
    # a later run took g1 up (its record holds g1): resuming the earlier one is no way out
    left_run(state_dir, inv, "20261205T110000Z-580.126.20-cd34", {"g1": "done"}, "stopped")
    _refuse_hosts_left(req, ["g1", "g2"], "kubernetes")


def test_with_drain_none_hosts_an_earlier_run_left_are_no_reason_to_refuse(
    tmp_path, monkeypatch, state_dir
):
    # nothing of theirs stays drained: the new run upgrades them and they are back
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    FakeFleet(facts={"g1": gpu_facts("g1")}).install(monkeypatch)
    left_run(state_dir, inv, LEFT_RUN, {"g1": "installing"})
    result = upgrade(inv, "--to", "580", "--drain", "none", "--check")
    assert result.exit_code == 0, result.output


# a host whose mirror has every package of the plan but the driver of --to
NO_DRIVER_580_126 = policy_answer(
    {
        "nvidia-open": ("580.65.06-1", ["580.65.06-1"]),
        "nvidia-driver-pinning-580": (None, ["580.65.06-1"]),
        "datacenter-gpu-manager-4-core": (None, ["1:4.6.0-1"]),
        "datacenter-gpu-manager-4-cuda13": (None, ["1:4.6.0-1"]),
        "datacenter-gpu-manager-exporter": (None, ["4.8.3-1"]),
    }
)


def test_a_driver_the_hosts_sources_lack_refuses_the_run_before_anything_is_touched(
    tmp_path, monkeypatch, state_dir
):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    fleet = FakeFleet(facts={h: gpu_facts(h) for h in ("g1", "g2")})
    fleet.connection("g1").on("apt-cache policy", 0, NO_DRIVER_580_126)
    fleet.install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--drain", "none")
    assert result.exit_code == 2, result.output
    assert (
        "REFUSED g1: its package sources do not offer nvidia-open=580.126.20-1 (offered: "
        "580.65.06-1)"
        in result.output
        and "[package-unavailable]" in result.output
    )
    assert "REFUSED g2" not in result.output  # its sources offer the plan (gpufleet)
    assert "nothing was changed" in result.output
    # on g1: the facts, the question, the lists refreshed, the question again; nothing else
    ran = fleet.commands("g1")
    assert [c for c in ran if "apt-get" in c and "update" in c] == [
        update_command(availability.LOCK_TIMEOUT_S)
    ]
    assert all("apt-cache policy" in c or "update" in c or "gpumon" in c for c in ran), ran
    assert not state_dir.exists() or list(state_dir.iterdir()) == []  # no run recorded


def test_a_host_without_its_kernels_headers_is_asked_for_them_and_refused_when_none_are_offered(
    tmp_path, monkeypatch, state_dir
):
    # NVIDIA's packages build the module with DKMS against the running kernel's headers; without
    # them the install succeeds with no module and the host reboots without a driver
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    facts = {h: gpu_facts(h) for h in ("g1", "g2")}
    facts["g1"].kernel_headers = False
    facts["g2"].kernel_headers = True
    fleet = FakeFleet(facts=facts)
    fleet.install(monkeypatch)
    offered = upgrade(inv, "--to", "580", "--check")  # gpufleet: its sources offer every package
    assert offered.exit_code == 0, offered.output
    asked = [c for c in fleet.commands("g1") if "apt-cache policy" in c]
    assert asked and "linux-headers-6.1.0-28-amd64" in asked[-1]
    assert not any("linux-headers" in c for c in fleet.commands("g2"))  # it has them

    lacking = NO_DRIVER_580_126.replace("580.65.06-1", "580.126.20-1")
    fleet.connection("g1").on("apt-cache policy", 0, lacking)
    result = upgrade(inv, "--to", "580", "--drain", "none")
    assert result.exit_code == 2, result.output
    assert (
        "REFUSED g1: its package sources do not offer linux-headers-6.1.0-28-amd64 (a kernel's "
        "headers, which DKMS builds the driver's module against: no source offers "
        "linux-headers-6.1.0-28-amd64) (after apt-get update)"
    ) in " ".join(result.output.split())
    assert "nvidia_driver_kernel_headers: false" in result.output
    assert "REFUSED g2" not in result.output
    assert not state_dir.exists() or list(state_dir.iterdir()) == []  # no run recorded


def test_a_host_whose_newer_installed_kernel_lacks_headers_is_asked_for_them_and_refused(
    tmp_path, monkeypatch, state_dir
):
    # a kernel update installed, not booted: dkms builds the module for it too, and skips it
    # without its headers; the reboot of the rollout may boot it with no NVIDIA module
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    facts = {"g1": gpu_facts("g1")}
    facts["g1"].kernel_headers = True
    facts["g1"].newest_kernel, facts["g1"].newest_kernel_headers = "6.1.0-31-amd64", False
    fleet = FakeFleet(facts=facts)
    fleet.connection("g1").on(
        "apt-cache policy", 0, NO_DRIVER_580_126.replace("580.65.06-1", "580.126.20-1")
    )
    fleet.install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--drain", "none")
    assert result.exit_code == 2, result.output
    (asked, *_) = [c for c in fleet.commands("g1") if "apt-cache policy" in c]
    assert "linux-headers-6.1.0-31-amd64" in asked and "linux-headers-6.1.0-28" not in asked
    assert (
        "REFUSED g1: its package sources do not offer linux-headers-6.1.0-31-amd64 (a kernel's "
        "headers, which DKMS builds the driver's module against: no source offers "
        "linux-headers-6.1.0-31-amd64) (after apt-get update)"
    ) in " ".join(result.output.split())
    assert not state_dir.exists() or list(state_dir.iterdir()) == []  # no run recorded


def test_a_host_without_room_for_the_install_is_refused_before_anything_is_touched(
    tmp_path, monkeypatch, state_dir
):
    # dpkg, DKMS and update-initramfs fail half-way on a full filesystem: the host would be
    # drained, its daemons stopped, and its packages left half-configured
    inv = write_inventory(
        tmp_path,
        {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}},
        gpu_vars={"nvidia_driver_min_free_mib": {"/var": 1024, "/boot": 100}},
    )
    fleet = FakeFleet(facts={h: gpu_facts(h) for h in ("g1", "g2")})
    for host, boot_mib in (("g1", 60), ("g2", 600)):
        fleet.connection(host).free = [f"/var {8 << 30} /", f"/boot {boot_mib << 20} /boot"]
    fleet.install(monkeypatch)
    for mode in ("--check", "--drain=none"):
        result = upgrade(inv, "--to", "580", mode)
        assert result.exit_code == 2, result.output
        assert (
            "REFUSED g1: too little free space for the driver's install: /boot (on /boot): "
            "60 MiB free, 100 MiB needed; free space there"
        ) in " ".join(result.output.split())
        assert "[disk-space]" in result.output and "REFUSED g2" not in result.output
    (asked, *_) = [c for c in fleet.commands("g1") if "apt-cache policy" in c]
    # the inventory's paths (yaml.safe_dump sorted them), not the role's defaults
    assert "df -B1 --output=file,avail,target -- /boot /var 2>" in asked
    assert not any("apt-get" in c for c in fleet.commands("g1"))  # nothing else asked
    assert not state_dir.exists() or list(state_dir.iterdir()) == []  # no run recorded


def test_a_branch_target_older_than_a_hosts_release_of_that_branch_is_refused_not_a_downgrade(
    tmp_path, monkeypatch, state_dir
):
    # NVIDIA ships R580 releases past the matrix's newest (580.159.04 is in the real captures):
    # --to 580 must not move such a host back, reboot and all
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    facts = {"g1": gpu_facts("g1", installed="580.159.04", loaded="580.159.04"),
             "g2": gpu_facts("g2")}  # fmt: skip
    FakeFleet(facts=facts).install(monkeypatch)
    for said in refused_to_580(inv):
        assert (
            "REFUSED g1: runs driver 580.159.04, newer than 580.126.20, the newest R580 release "
            "the matrix knows: --to 580 would downgrade it; give the release the hosts are to "
            "run (--to 580.159.04 or newer"
        ) in said
        assert "[driver-downgrade]" in said and "REFUSED g2" not in said
    assert not state_dir.exists() or list(state_dir.iterdir()) == []  # no run recorded


def test_an_explicit_older_version_is_a_downgrade_said_not_refused(
    tmp_path, monkeypatch, state_dir
):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    facts = {"g1": gpu_facts("g1", installed="580.159.04", loaded="580.159.04")}
    FakeFleet(facts=facts).install(monkeypatch)
    result = upgrade(inv, "--to", "580.126.20", "--check")
    assert result.exit_code == 0, result.output
    assert "NOTE g1: driver 580.159.04 -> 580.126.20 is a downgrade, as --to 580.126.20 asks" in (
        result.output
    )
    assert "REFUSED" not in result.output


def test_a_host_whose_boot_loader_starts_a_kernel_without_the_module_is_refused(
    tmp_path, monkeypatch, state_dir
):
    # DKMS builds the new module for the running and the newest kernel: GRUB pinned to an older
    # one brings the host back from the rollout's reboot without its driver
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    fleet = FakeFleet(facts={h: gpu_facts(h) for h in ("g1", "g2")})  # running 6.1.0-28-amd64
    older = "gnulinux-6.1.0-25-amd64-advanced-8c2f"
    images = ["image=6.1.0-25-amd64", "image=6.1.0-28-amd64"]
    fleet.connection("g1").boot = ["default=saved", f"saved_entry={older}", *images]
    fleet.connection("g2").boot = ["default=0", *images]
    fleet.install(monkeypatch)
    for said in refused_to_580(inv):
        assert (
            f"REFUSED g1: its reboot boots kernel 6.1.0-25-amd64 (GRUB_DEFAULT=saved, saved_entry "
            f"'{older}'), which DKMS builds no NVIDIA module for (it builds for 6.1.0-28-amd64)"
        ) in said
        assert "[boot-kernel]" in said and "REFUSED g2" not in said
    assert not any("apt-get" in c for c in fleet.commands("g1"))  # nothing else asked
    assert not state_dir.exists() or list(state_dir.iterdir()) == []  # no run recorded


def test_a_secure_boot_host_whose_dkms_key_is_not_enrolled_is_refused(
    tmp_path, monkeypatch, state_dir
):
    # under Secure Boot the kernel loads only modules signed by a key it trusts; DKMS signs the
    # new one with its certificate, and one nobody enrolled means no driver after the reboot
    inv = write_inventory(tmp_path, {f"g{i}": {"gpu_model": "H100"} for i in (1, 2, 3)})
    fleet = FakeFleet(facts={h: gpu_facts(h) for h in ("g1", "g2", "g3")})
    enforced = ["secure_boot=1", "setup_mode=0", "cert=/var/lib/dkms/mok.pub"]
    fleet.connection("g1").signing = [*enforced, "test_key=/var/lib/dkms/mok.pub is not enrolled"]
    fleet.connection("g2").signing = [
        *enforced,
        "test_key=/var/lib/dkms/mok.pub is already enrolled",
    ]
    fleet.connection("g3").signing = [*enforced, "test_key="]  # no mokutil: a note
    fleet.install(monkeypatch)
    for said in refused_to_580(inv):
        assert (
            "REFUSED g1: it runs under Secure Boot and DKMS signs the driver's module with "
            "/var/lib/dkms/mok.pub, which is not enrolled (mokutil --test-key): its kernel would "
            "reject the new module at the rollout's reboot"
        ) in said
        assert "[module-signing]" in said and "mokutil --import /var/lib/dkms/mok.pub" in said
        assert "REFUSED g2" not in said and "REFUSED g3" not in said
        assert "cannot be told without mokutil" in said  # g3's note
    assert not any("apt-get" in c for c in fleet.commands("g1"))  # nothing else asked
    assert not state_dir.exists() or list(state_dir.iterdir()) == []  # no run recorded


def test_check_mode_notes_a_driver_the_hosts_lists_lack_and_refreshes_nothing(
    tmp_path, monkeypatch, state_dir
):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    fleet = FakeFleet(facts={"g1": gpu_facts("g1")})
    fleet.connection("g1").on("apt-cache policy", 0, NO_DRIVER_580_126)
    fleet.install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check")
    assert result.exit_code == 0, result.output
    assert "NOTE g1: not in its package lists: nvidia-open=580.126.20-1" in result.output
    assert not any("update" in c for c in fleet.commands("g1"))
