"""`up` never changes a loaded NVIDIA driver, and keeps the driver a completed `upgrade-driver`
run recorded on the host (deployer/gpu/preflight.py, deployer/gpu/driver_record.py), over a scripted
fleet: facts and the on-host record are read, nothing else runs before a refusal."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deployer.cli import cli
from deployer.gpu import driver_record, gpu_plan
from deployer.gpu.driver_record import DriverRecord
from deployer.session import DeploySession, RunOptions
from tests.unit.gpufleet import FakeFleet, gpu_facts, write_inventory

PINNED = {"gpu_model": "H100", "nvidia_driver_version": "580.65.06"}
UNPINNED = {"gpu_model": "H100"}  # the matrix's default branch: 595.45.04 for an H100 today


def record_json(version="580.126.20", branch="580", inventory=None) -> str:
    record = DriverRecord(
        version=version,
        branch=branch,
        run_id="20261201T000000Z-580.126.20-abcd",
        finished=1.0,
        inventory=inventory or {"version": "580.65.06", "branch": None},
    )
    return json.dumps(record.to_json())


def fleet(monkeypatch, *, record=None, **facts_kw) -> FakeFleet:
    files = {"g1": {driver_record.RECORD_PATH: record}} if record else {}
    return FakeFleet(facts={"g1": gpu_facts("g1", **facts_kw)}, files=files).install(monkeypatch)


def session(inv, *extra, tags=frozenset()) -> DeploySession:
    return DeploySession.load(RunOptions(inventory=inv, extra_vars=list(extra), tags=tags))


def preflight(inv, *extra, out_of_service=False, tags=frozenset()):
    s = session(inv, *extra, tags=tags)
    return s, s.preflight(offline=False, out_of_service=out_of_service)


# ---- up refuses a change of a loaded driver -----------------------------------------------------


def test_up_with_another_driver_on_a_live_host_exits_2_naming_host_versions_and_the_way(
    tmp_path, monkeypatch
):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    f = fleet(monkeypatch)
    result = CliRunner().invoke(
        cli, ["up", "-i", str(inv), "-e", "nvidia_driver_version=580.126.20"]
    )
    assert result.exit_code == 2, result.output
    assert "g1: driver 580.65.06 is loaded" in result.output
    assert "would install driver 580.126.20 (from -e nvidia_driver_version)" in result.output
    assert "upgrade-driver --to 580.126.20 --limit g1" in result.output
    assert "[live-driver-change]" in result.output
    assert "nothing was changed; the hosts were only read" in result.output
    assert f.commands("g1") == [driver_record.READ_COMMAND]  # the record read, nothing written


def test_up_check_is_refused_the_same_way(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch)
    result = CliRunner().invoke(
        cli, ["up", "-i", str(inv), "--check", "-e", "nvidia_driver_version=580.126.20"]
    )
    assert result.exit_code == 2 and "[live-driver-change]" in result.output


def test_an_inventory_that_moved_past_the_loaded_driver_is_refused_too(tmp_path, monkeypatch):
    # unpinned: the matrix's default (595.45.04) is not what the host runs
    inv = write_inventory(tmp_path, {"g1": UNPINNED})
    fleet(monkeypatch)
    _, refused = preflight(inv)
    assert [(r.host, r.rule) for r in refused] == [("g1", "live-driver-change")]
    assert "595.45.04 (from the inventory)" in refused[0].message
    assert "nvidia_driver_version: 580.65.06" in refused[0].fix


def test_the_planned_driver_when_loaded_is_no_refusal(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch)
    assert preflight(inv)[1] == []


def test_installed_packages_of_another_driver_under_the_planned_module_are_a_repair(
    tmp_path, monkeypatch
):
    # the state a bad `up` left (new packages, old module loaded): putting the packages back to
    # the loaded module's version changes no loaded driver
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch, installed="580.126.20", loaded="580.65.06")
    assert preflight(inv)[1] == []


def test_a_first_install_on_a_host_without_a_driver_is_a_plain_up(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch, installed=None, loaded=None)
    assert preflight(inv, "nvidia_driver_version=580.126.20")[1] == []


def test_packages_waiting_for_a_reboot_with_no_module_loaded_may_change(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch, installed="580.65.06", loaded=None)
    assert preflight(inv, "nvidia_driver_version=580.126.20")[1] == []


def test_out_of_service_lifts_the_refusal(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch)
    assert preflight(inv, "nvidia_driver_version=580.126.20", out_of_service=True)[1] == []


def test_a_run_without_gpu_role_tasks_for_the_host_is_not_refused(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": UNPINNED})
    fleet(monkeypatch)
    assert preflight(inv, tags=frozenset({"node_exporter"}))[1] == []


def test_a_plan_the_matrix_refuses_is_refused_once_by_the_matrix(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "V100"}})
    fleet(monkeypatch, model="V100")
    _, refused = preflight(inv, "nvidia_driver_version=595.45.04")
    assert [r.rule for r in refused] == ["arch-last-branch"]


# ---- a branch never steps a host back --------------------------------------------------------

BRANCH_580 = {"gpu_model": "H100", "nvidia_driver_branch": "580"}  # the matrix's newest: 580.126.20


@pytest.mark.parametrize("out_of_service", [False, True])
def test_a_branch_whose_newest_known_release_is_older_than_the_hosts_is_refused(
    tmp_path, monkeypatch, out_of_service
):
    # NVIDIA ships releases past the matrix (580.159.04 is in the real captures): installing
    # the branch's newest known release would downgrade the host, out of service or not
    inv = write_inventory(tmp_path, {"g1": BRANCH_580})
    fleet(monkeypatch, installed="580.159.04", loaded="580.159.04")
    _, refused = preflight(inv, out_of_service=out_of_service)
    assert [(r.host, r.rule) for r in refused] == [("g1", "driver-downgrade")]  # said once
    assert refused[0].message == (
        "runs driver 580.159.04, newer than 580.126.20, which nvidia_driver_branch 580 resolves "
        "to (the newest R580 release the matrix knows): the install would downgrade it"
    )
    assert "keep it with nvidia_driver_version: 580.159.04" in refused[0].fix


def test_the_default_branch_never_steps_a_host_back_either(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": UNPINNED})  # the matrix's default: 595.45.04
    fleet(monkeypatch, installed="595.80", loaded="595.80")  # the L40S capture's release
    _, refused = preflight(inv)
    assert [(r.host, r.rule) for r in refused] == [("g1", "driver-downgrade")]
    assert "which the default branch (no nvidia_driver_version" in refused[0].message


@pytest.mark.parametrize(
    ("host", "extra"),
    [
        ({"gpu_model": "H100", "nvidia_driver_version": "580.126.20"}, ()),  # an exact version
        (BRANCH_580, ("nvidia_driver_version=580.126.20",)),  # an exact wish with -e
    ],
)
def test_an_exact_older_version_is_no_downgrade_refusal(tmp_path, monkeypatch, host, extra):
    inv = write_inventory(tmp_path, {"g1": host})
    fleet(monkeypatch, installed="580.159.04", loaded="580.159.04")
    _, refused = preflight(inv, *extra)
    assert [r.rule for r in refused] == ["live-driver-change"]  # a live change, as any other
    assert preflight(inv, *extra, out_of_service=True)[1] == []


def test_up_with_a_branch_older_than_the_host_exits_2_having_only_read(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": BRANCH_580})
    f = fleet(monkeypatch, installed="580.159.04", loaded="580.159.04")
    result = CliRunner().invoke(cli, ["up", "-i", str(inv), "--out-of-service"])
    assert result.exit_code == 2, result.output
    assert "[driver-downgrade]" in result.output
    assert f.commands("g1") == [driver_record.READ_COMMAND]


# ---- the upgrade-driver record ------------------------------------------------------------------


def test_up_keeps_the_driver_a_rollout_recorded_while_the_inventory_lags(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch, record=record_json(), installed="580.126.20", loaded="580.126.20")
    s, refused = preflight(inv)
    assert refused == []
    assert s.driver_choice("g1").variables["nvidia_driver_version"] == "580.126.20"
    s.build_plan(s.facts)
    assert "keeps driver 580.126.20 from upgrade-driver run" in s.driver_notes()["g1"]


def test_the_record_keeps_the_driver_of_an_unpinned_inventory_when_the_default_moves(
    tmp_path, monkeypatch
):
    inv = write_inventory(tmp_path, {"g1": UNPINNED})
    unpinned = {"version": None, "branch": None}
    fleet(monkeypatch, record=record_json(inventory=unpinned), loaded="580.126.20")
    s, refused = preflight(inv)
    assert refused == []
    assert s.driver_choice("g1").origin.startswith("upgrade-driver run ")


def test_an_inventory_changed_since_the_rollout_is_a_new_wish_and_refused_on_a_live_host(
    tmp_path, monkeypatch
):
    inv = write_inventory(tmp_path, {"g1": {**PINNED, "nvidia_driver_version": "595.45.04"}})
    fleet(monkeypatch, record=record_json(), loaded="580.126.20")
    _, refused = preflight(inv)
    assert [r.rule for r in refused] == ["live-driver-change"]
    assert "changed since upgrade-driver run" in refused[0].message


def test_an_explicit_driver_overrides_the_record(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch, record=record_json(), loaded="580.126.20")
    s, refused = preflight(inv, "nvidia_driver_version=580.65.06")
    assert [r.rule for r in refused] == ["live-driver-change"]
    assert s.driver_choice("g1").variables["nvidia_driver_version"] == "580.65.06"


def test_an_unreadable_record_is_no_record(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch, record="{not json", loaded="580.126.20")
    _, refused = preflight(inv)
    assert [r.rule for r in refused] == ["live-driver-change"]  # refused, never changed


def test_the_role_removes_a_record_of_another_driver_than_planned(tmp_path, monkeypatch):
    facts = gpu_facts("g1", installed=None, loaded=None)
    record = driver_record.parse(record_json())
    plan = gpu_plan.template_plan("g1", PINNED | {"gpu_count": 8}, facts, record)
    assert plan["driver_record"] == {"path": driver_record.RECORD_PATH, "stale": True}
    same = gpu_plan.template_plan(
        "g1", {**PINNED, "gpu_count": 8, "nvidia_driver_version": "580.126.20"}, facts, record
    )
    assert same["driver_record"]["stale"] is False
    assert (
        gpu_plan.template_plan("g1", PINNED | {"gpu_count": 8}, facts)["driver_record"]["stale"]
        is False
    )


# ---- check sees what up sees --------------------------------------------------------------------


def test_check_reports_the_refusal_up_would_make(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": UNPINNED})
    fleet(monkeypatch)
    result = CliRunner().invoke(cli, ["check", "-i", str(inv)])
    assert result.exit_code == 2, result.output
    assert "REFUSED g1: driver 580.65.06 is loaded" in result.output


def test_check_notes_a_driver_kept_from_a_rollout_and_passes(tmp_path, monkeypatch):
    inv = write_inventory(tmp_path, {"g1": PINNED})
    fleet(monkeypatch, record=record_json(), installed="580.126.20", loaded="580.126.20")
    result = CliRunner().invoke(cli, ["check", "-i", str(inv), "--output", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and "keeps driver 580.126.20" in data["notes"]["g1"]


# ---- the record's format ------------------------------------------------------------------------


def test_a_record_reads_back_as_written():
    record = driver_record.parse(record_json())
    assert record is not None and record.version == "580.126.20"
    assert driver_record.parse(json.dumps(record.to_json())) == record


@pytest.mark.parametrize("text", ["", "  \n", "[]", '{"schema": 2}', '{"schema": 1}', "nul"])
def test_anything_else_is_no_record(text):
    assert driver_record.parse(text) is None


def test_the_record_is_written_atomically_as_root_readable_json():
    record = driver_record.parse(record_json())
    command = driver_record.write_command(record)
    assert "umask 022" in command
    assert command.endswith(f"mv -f {driver_record.RECORD_PATH}.tmp {driver_record.RECORD_PATH}")
    assert '\'{"branch": "580"' in command
