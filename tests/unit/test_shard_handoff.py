"""Re-sharding without a blind spot (deployer/monitoring/handoff.py): while the layout changes,
every replica keeps the hosts its shard had and takes the hosts its shard gets; the next pass,
after the first converged every host, lets go of the hosts that moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer import cli, run_lock
from deployer.errors import InputError
from deployer.monitoring import handoff
from deployer.monitoring.http import Response
from deployer.results import RunReport
from deployer.session import DeploySession, RunOptions

REPO = Path(__file__).resolve().parents[2]
GPUS = [f"gpu{i:02d}" for i in range(1, 25)]
LOAD = DeploySession.load  # the real one: the up tests below stand a fake in for it


def inventory(shards: dict[str, str], by: str = "host", global_pair: bool = False) -> str:
    hosts = "\n".join(
        f"    {g}: {{ansible_host: 192.0.2.{10 + i}, rack: r{i % 3}}}" for i, g in enumerate(GPUS)
    )
    replicas = "\n".join(
        f"    {r}: {{ansible_host: 198.51.100.{10 + i}"
        + (f", prometheus_shard: {s}}}" if s else "}")
        for i, (r, s) in enumerate(shards.items())
    )
    tier = "gpumon_global_tier: both, " if global_pair else ""
    mons = "    mon01: {ansible_host: 203.0.113.1}\n    mon02: {ansible_host: 203.0.113.2}\n"
    return (
        f"all:\n  vars: {{{tier}cluster: c1, prometheus_shard_by: {by}}}\n  hosts:\n{hosts}\n"
        f"{replicas}\n{mons if global_pair else ''}"
        "  children:\n"
        + ("    prometheus_global: {hosts: {mon01: {}, mon02: {}}}\n" if global_pair else "")
        + f"    gpu: {{hosts: {{{', '.join(f'{g}: {{}}' for g in GPUS)}}}}}\n"
        f"    prometheus: {{hosts: {{{', '.join(f'{r}: {{}}' for r in shards)}}}}}\n"
    )


PLAYS = """
- name: Prometheus
  hosts: prometheus
  serial: 1
  roles: [prometheus]
"""

# The federation tier's pair, planned after the shards as in site.yml
GLOBAL_PLAY = """
- name: Prometheus global pair
  hosts: prometheus_global
  serial: 1
  roles: [prometheus]
"""

TWO = {"prom01": "a", "prom02": "a", "prom03": "b", "prom04": "b"}
THREE = {**TWO, "prom05": "c", "prom06": "c"}
ONE_PAIR = {"prom01": "", "prom02": ""}


@pytest.fixture(autouse=True)
def _records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(handoff.RECORD_DIR_ENV, str(tmp_path / "records"))
    handoff.forget()
    yield
    handoff.forget()


def dcgm_hosts(
    tmp_path: Path, shards: dict[str, str], by: str = "host", global_pair: bool = False
) -> dict[str, set[str]]:
    """replica -> the GPU hosts its dcgm file_sd lists, as one planning pass renders them."""
    handoff.forget()
    (tmp_path / "inventory.yml").write_text(inventory(shards, by, global_pair))
    (tmp_path / "site.yml").write_text(PLAYS + (GLOBAL_PLAY if global_pair else ""))
    session = LOAD(RunOptions(inventory=tmp_path / "inventory.yml", site=tmp_path / "site.yml"))
    out = {}
    for plan in session.plans:
        for play in plan.plays:
            for t in play.tasks:
                if str(t.args.get("dest", "")).endswith("/dcgm.json"):
                    groups = json.loads(t.args["content"])
                    out[plan.host] = {g["labels"]["node"] for g in groups}
    return out


def converged(
    tmp_path: Path, shards: dict[str, str], by: str = "host", global_pair: bool = False
) -> dict[str, set[str]]:
    """One whole, clean pass: what it rendered, then its layout recorded."""
    got = dcgm_hosts(tmp_path, shards, by, global_pair)
    handoff.settle()
    return got


def test_the_first_up_records_the_layout_and_hands_nothing_over(tmp_path):
    got = dcgm_hosts(tmp_path, TWO)
    assert handoff.handing_over() == []
    assert got["prom01"] == got["prom02"] and got["prom01"].isdisjoint(got["prom03"])
    assert handoff.settle() and dcgm_hosts(tmp_path, TWO) == got


def test_a_new_shard_takes_its_hosts_while_the_old_owners_keep_them_one_pass(tmp_path):
    before = converged(tmp_path, TWO)
    during = dcgm_hosts(tmp_path, THREE)
    assert handoff.handing_over()
    c = during["prom05"]
    assert c and during["prom06"] == c
    assert during["prom01"] == before["prom01"]  # a keeps all it had, c's included
    assert during["prom03"] == before["prom03"]
    handoff.settle()
    after = dcgm_hosts(tmp_path, THREE)
    assert after["prom05"] == c
    assert after["prom01"] == before["prom01"] - c and after["prom03"] == before["prom03"] - c
    assert set().union(*after.values()) == set(GPUS)
    assert handoff.handing_over() == []


def test_during_the_hand_over_every_host_is_scraped_by_its_old_and_its_new_shard(tmp_path):
    before = converged(tmp_path, THREE)
    during = dcgm_hosts(tmp_path, THREE, by="rack")
    handoff.settle()
    after = dcgm_hosts(tmp_path, THREE, by="rack")
    for replica, hosts in during.items():
        assert hosts == before[replica] | after[replica]
    moved = {h for r in after for h in after[r] - before[r]}
    assert moved  # by rack moves some hosts


def test_a_removed_shard_s_hosts_go_to_the_shards_that_stay_in_the_first_pass(tmp_path):
    converged(tmp_path, THREE)
    during = dcgm_hosts(tmp_path, TWO)
    assert during["prom01"] | during["prom03"] == set(GPUS)


def test_from_one_pair_to_shards_the_pair_keeps_every_host_and_a_new_replica_takes_its_own(
    tmp_path,
):
    converged(tmp_path, ONE_PAIR)
    during = dcgm_hosts(tmp_path, TWO)
    assert handoff.handing_over()
    handoff.settle()
    after = dcgm_hosts(tmp_path, TWO)
    assert during["prom01"] == during["prom02"] == set(GPUS)  # the pair scraped every host
    # prom03 and prom04 scraped nothing before: their shard's hosts only, not the pair's load
    assert during["prom03"] == during["prom04"] == after["prom03"] != set(GPUS)
    assert after["prom01"] == after["prom02"] != set(GPUS)


def test_a_pair_split_across_shards_keeps_every_host_in_both_for_one_pass(tmp_path):
    converged(tmp_path, ONE_PAIR)
    split = {"prom01": "a", "prom02": "b", "prom03": "a", "prom04": "b"}
    during = dcgm_hosts(tmp_path, split)
    assert during["prom01"] == during["prom02"] == set(GPUS)
    assert during["prom03"] | during["prom04"] == set(GPUS) != during["prom03"]


def test_the_record_follows_the_pair_s_replicas_without_a_hand_over(tmp_path):
    converged(tmp_path, ONE_PAIR)
    replaced = {"prom07": "", "prom08": ""}
    dcgm_hosts(tmp_path, replaced)
    assert handoff.handing_over() == []  # the same layout: one pass
    handoff.settle()
    record = json.loads(next((tmp_path / "records").iterdir()).read_text())
    assert record["shards"] == [""] and record["replicas"] == ["prom07", "prom08"]
    during = dcgm_hosts(tmp_path, {"prom07": "a", "prom08": "a", "prom09": "b", "prom10": "b"})
    assert during["prom07"] == during["prom08"] == set(GPUS) != during["prom09"]


def test_a_record_without_replicas_has_every_replica_keep_every_host_for_one_pass(tmp_path):
    converged(tmp_path, ONE_PAIR)
    record = next((tmp_path / "records").iterdir())
    record.write_text(json.dumps({"format": 1, "shards": [""], "by": "host"}))  # an older record
    during = dcgm_hosts(tmp_path, TWO)
    assert all(hosts == set(GPUS) for hosts in during.values())
    handoff.settle()
    assert json.loads(record.read_text())["replicas"] == list(TWO)


def test_with_a_global_pair_from_one_pair_to_shards_still_hands_over_and_records_the_shards(
    tmp_path,
):
    # The global pair sees the whole tier (every host, one pair's view): it recorded that view
    # in the shards' record, planned after them, so no re-shard handed over and the record
    # never held the shards.
    converged(tmp_path, ONE_PAIR, global_pair=True)
    during = dcgm_hosts(tmp_path, TWO, global_pair=True)
    assert handoff.handing_over()
    assert during["prom01"] == during["prom02"] == set(GPUS) != during["prom03"]
    handoff.settle()
    record = json.loads(next((tmp_path / "records").iterdir()).read_text())
    assert record["shards"] == ["a", "b"] and record["replicas"] == list(TWO)
    after = dcgm_hosts(tmp_path, TWO, global_pair=True)
    assert handoff.handing_over() == [] and after["prom01"] != set(GPUS)


def test_with_a_global_pair_a_new_shard_is_handed_over(tmp_path):
    before = converged(tmp_path, TWO, global_pair=True)
    during = dcgm_hosts(tmp_path, THREE, global_pair=True)
    assert handoff.handing_over()
    assert during["prom01"] == before["prom01"] and during["prom03"] == before["prom03"]


def test_two_tiers_given_one_record_are_refused_naming_it(tmp_path):
    given = tmp_path / "one-record.json"
    groups = {"prometheus": ["prom01", "prom02"], "prometheus_west": ["prom07", "prom08"]}
    east = {"inventory_hostname": "prom01", "groups": groups, handoff.RECORD_VAR: str(given)}
    handoff.previous(east, handoff.Layout(("a", "b"), "host", ("prom01", "prom02")))
    west = {"inventory_hostname": "prom07", "groups": groups, handoff.RECORD_VAR: str(given)}
    with pytest.raises(InputError) as refused:
        handoff.previous(west, handoff.Layout(handoff.UNSHARDED, "host", ("prom07", "prom08")))
    assert refused.value.key == handoff.RECORD_VAR
    assert str(given) in str(refused.value) and "two Prometheus tiers" in str(refused.value)
    assert "shards a, b (by host) of prom01, prom02; one pair of prom07, prom08" in str(
        refused.value
    )
    assert not given.exists()


def test_another_tiers_record_is_refused_before_anything_is_planned(tmp_path):
    # Two inventories that set the same cluster (or none) share the default record: the second
    # tier would hand over from a layout its replicas never had.
    converged(tmp_path, TWO)
    record = next((tmp_path / "records").iterdir())
    kept = record.read_text()
    with pytest.raises(InputError) as refused:
        dcgm_hosts(tmp_path, {"prom11": "", "prom12": ""})
    said = str(refused.value)
    assert refused.value.key == handoff.RECORD_VAR and str(record) in said
    assert "another tier's (shards a, b (by host) of prom01, prom02, prom03, prom04)" in said
    assert "this tier is one pair of prom11, prom12" in said and "set `cluster`" in said
    assert record.read_text() == kept


def test_up_with_another_tiers_record_exits_2_before_connecting(tmp_path, monkeypatch):
    converged(tmp_path, TWO)
    (tmp_path / "inventory.yml").write_text(inventory({"prom11": "a", "prom12": "a"}))
    monkeypatch.chdir(tmp_path)
    connected = []
    monkeypatch.setattr(DeploySession, "gather_facts", lambda self, *a, **k: connected.append(a))
    result = CliRunner().invoke(cli.cli, ["up", "-i", "inventory.yml", "--site", "site.yml"])
    assert result.exit_code == 2, result.output
    assert "another tier's" in result.output and connected == []


def test_a_tier_that_keeps_one_of_its_replicas_hands_over_as_before(tmp_path):
    # replicas replaced in the same up as a re-shard: while one stays, the record is this tier's
    before = converged(tmp_path, TWO)
    during = dcgm_hosts(tmp_path, {"prom01": "a", "prom07": "a", "prom08": "c", "prom09": "c"})
    assert handoff.handing_over() and during["prom01"] >= before["prom01"]


def test_an_unreadable_record_is_refused_naming_it(tmp_path):
    converged(tmp_path, TWO)
    record = next((tmp_path / "records").iterdir())
    record.write_text("{not json")
    with pytest.raises(InputError, match=str(record)):
        dcgm_hosts(tmp_path, THREE)


# ---------------------------------------------------------------- one up runs both passes


class FakeSession:
    """Stands in for a DeploySession: each converge renders the layout as the role would."""

    passes: list[dict[str, set[str]]] = []
    holders: list[str | None] = []  # who held the inventory's lock during each pass
    fail = False
    tmp: Path
    shards: dict[str, str]

    def converge(self, **_: object) -> RunReport:
        FakeSession.holders.append(run_lock.holder("inv.yml"))
        FakeSession.passes.append(dcgm_hosts(FakeSession.tmp, FakeSession.shards))
        report = RunReport()
        report.host("prom01").failed = FakeSession.fail
        return report


SLEPT: list[float] = []


def run_up(monkeypatch, tmp_path: Path, shards: dict[str, str], *flags: str, fail=False):
    FakeSession.passes, FakeSession.holders, FakeSession.fail = [], [], fail
    FakeSession.tmp, FakeSession.shards = tmp_path, shards
    SLEPT.clear()
    monkeypatch.setattr(cli.DeploySession, "load", lambda options: FakeSession())
    monkeypatch.setattr(cli.time, "sleep", SLEPT.append)
    return CliRunner().invoke(cli.cli, ["up", "-i", "inv.yml", *flags])


def test_one_up_hands_over_then_lets_go_and_the_next_up_is_one_pass(tmp_path, monkeypatch):
    converged(tmp_path, TWO)
    result = run_up(monkeypatch, tmp_path, THREE)
    assert len(FakeSession.passes) == 2, result.output
    assert "now the old owners let go" in result.output
    first, second = FakeSession.passes
    assert second["prom01"] < first["prom01"]
    # between the passes: the longest scrape interval (the role's inference tier, 30s) and a margin
    assert SLEPT == [30 + handoff.MARGIN_S]
    run_up(monkeypatch, tmp_path, THREE)
    assert len(FakeSession.passes) == 1 and SLEPT == []


def test_a_failed_or_limited_up_keeps_handing_over(tmp_path, monkeypatch):
    before = converged(tmp_path, TWO)
    result = run_up(monkeypatch, tmp_path, THREE, fail=True)
    assert len(FakeSession.passes) == 1 and "until an up of every host" in result.output
    run_up(monkeypatch, tmp_path, THREE, "--limit", "prom01")
    assert len(FakeSession.passes) == 1 and SLEPT == []
    assert FakeSession.passes[0]["prom01"] == before["prom01"]  # still both layouts' hosts
    # the lock says so, for status: an up with --limit does not hand over
    [held] = FakeSession.holders
    assert held is not None and held.startswith("up with --limit, pid ")


def test_a_whole_up_says_so_in_the_inventory_s_lock(tmp_path, monkeypatch):
    converged(tmp_path, TWO)
    run_up(monkeypatch, tmp_path, THREE)
    assert [h.split(", pid ")[0] for h in FakeSession.holders if h] == ["up", "up"]
    run_up(monkeypatch, tmp_path, THREE, "--tags", "prometheus", "--skip-tags", "rules")
    assert FakeSession.holders[0].startswith("up with --tags --skip-tags, pid ")


def test_planning_another_inventory_in_the_same_process_is_a_pass_of_its_own(tmp_path):
    # what one inventory's planning saw of the record is not a second tier of the next one
    given = tmp_path / "one-record.json"
    first = {"inventory_hostname": "prom01", "groups": {}, handoff.RECORD_VAR: str(given)}
    handoff.previous(first, handoff.Layout(("a", "b"), "host", ("prom01", "prom02")))
    again = {"inventory_hostname": "prom01", "groups": {}, handoff.RECORD_VAR: str(given)}
    handoff.previous(again, handoff.Layout(handoff.UNSHARDED, "host", ("prom01", "prom02")))
    assert handoff.handing_over() == []


# ---------------------------------------------------------------- status, which only reads


def test_status_shows_another_tiers_record_as_a_failed_row_and_checks_the_rest(tmp_path):
    # up refuses the record before touching a host; status, which only reads, still checks the
    # stack (as if there were no record: no hand-over expected) and names the record's problem.
    from deployer.monitoring import status

    converged(tmp_path, TWO)
    record = next((tmp_path / "records").iterdir())
    kept = record.read_text()
    (tmp_path / "inventory.yml").write_text(inventory({"prom11": "", "prom12": ""}))
    exp = status.load_expectation(tmp_path / "inventory.yml", site=tmp_path / "site.yml")
    assert [r.host for r in exp.replicas] == ["prom11", "prom12"]
    assert {t.node for t in exp.targets if t.job == "dcgm"} == set(GPUS)
    [said] = exp.record_problems
    assert str(record) in said and "another tier's (shards a, b (by host) of prom01" in said

    def unanswered(url: str, *_: object) -> Response:
        return Response(0, error=f"no answer from {url}")

    checks = status.collect(exp, unanswered, None, store_fetch=unanswered)
    [row] = [c for c in checks if c.check == "shard layout record"]
    assert (row.component, row.host, row.state, row.detail) == ("prometheus", "*", "failed", said)
    assert any(c.check == "ready" and c.host == "prom11" for c in checks)  # the rest is checked
    assert record.read_text() == kept
    with pytest.raises(InputError, match="another tier's"):  # up, after status, still refuses
        dcgm_hosts(tmp_path, {"prom11": "", "prom12": ""})


def test_status_names_an_unreadable_record_once(tmp_path):
    from deployer.monitoring import status

    converged(tmp_path, TWO)
    record = next((tmp_path / "records").iterdir())
    record.write_text("{not json")
    (tmp_path / "inventory.yml").write_text(inventory(THREE))
    exp = status.load_expectation(tmp_path / "inventory.yml", site=tmp_path / "site.yml")
    [said] = exp.record_problems
    assert said.startswith(
        f"{handoff.RECORD_VAR}: {record}: the shard layout record cannot be read"
    )
    assert set(exp.replica_targets) == set(THREE)


def test_status_wait_does_not_wait_on_a_record_row_alone(monkeypatch):
    # waiting cannot mend a record up refuses; a row that is pending is still waited for
    from deployer.monitoring import status
    from deployer.monitoring.check import FAILED, OK, PENDING, Check

    record = Check("prometheus", "*", status.RECORD_CHECK, FAILED, "another tier's")
    rounds = [[Check("prometheus", "prom01", "ready", PENDING), record],
              [Check("prometheus", "prom01", "ready", OK), record]]  # fmt: skip
    monkeypatch.setattr(status, "collect", lambda *_, **__: rounds.pop(0))
    slept: list[float] = []
    got = status.collect_until(status.StackExpectation(), None, wait_s=300, sleep=slept.append)
    assert got[1] == record and got[0].ok and slept == [status.WAIT_EVERY_S] and not rounds


def test_status_says_a_re_shard_up_has_not_finished_and_expects_the_hand_over(tmp_path):
    # The inventory asks for a third shard; the last whole up recorded two. Each moved host is
    # expected from its old and its new shard (what up's first pass renders), and one row says
    # why the new shard's replicas do not have it yet.
    from deployer.monitoring import status

    converged(tmp_path, TWO)
    record = next((tmp_path / "records").iterdir())
    kept = record.read_text()
    (tmp_path / "inventory.yml").write_text(inventory(THREE))
    exp = status.load_expectation(tmp_path / "inventory.yml", site=tmp_path / "site.yml")
    assert exp.record_problems == []
    [said] = exp.reshards
    assert said == (
        f"{record}: shards a, b (by host) of prom01, prom02, prom03, prom04 recorded, the inventory asks "
        "for shards a, b, c (by host) of prom01, prom02, prom03, prom04, prom05, prom06"
    )
    handoff.forget()
    during = dcgm_hosts(tmp_path, THREE)  # up's first pass
    expected = {
        r: {t.node for t in targets if t.job == "dcgm"}
        for r, targets in exp.replica_targets.items()
    }
    assert expected == during
    checks = status.collect(exp, lambda url, *_: Response(0, error="no"), None,
                            store_fetch=lambda url, *_: Response(0, error="no"))  # fmt: skip
    [row] = [c for c in checks if c.check == status.RESHARD_CHECK]
    assert (row.host, row.state) == ("*", "failed") and row.detail.startswith(said)
    assert "No `up` runs: a whole `up` hands the moved hosts over" in row.detail
    assert record.read_text() == kept  # status records nothing
    # while an up holds the inventory's lock, it is the one handing over: the row names it
    with run_lock.changing(tmp_path / "inventory.yml", "up"):
        during_up = status.load_expectation(tmp_path / "inventory.yml", site=tmp_path / "site.yml")
    assert during_up.changing_run is not None and during_up.changing_run.startswith("up, pid ")
    checks = status.collect(during_up, lambda url, *_: Response(0, error="no"), None,
                            store_fetch=lambda url, *_: Response(0, error="no"))  # fmt: skip
    [row] = [c for c in checks if c.check == status.RESHARD_CHECK]
    assert f"A run holds this inventory's lock ({during_up.changing_run})" in row.detail
    assert "run status again when it has finished" in row.detail


def test_status_wait_does_not_wait_on_a_re_shard_row_alone_when_no_up_runs(monkeypatch):
    from deployer.monitoring import status
    from deployer.monitoring.check import FAILED, Check

    row = Check("prometheus", "*", status.RESHARD_CHECK, FAILED, "shards a, b recorded")
    monkeypatch.setattr(status, "collect", lambda *_, **__: [row])
    for holder in (None, "up with --limit, pid 7, since then", "upgrade-driver, pid 7, since"):
        slept: list[float] = []
        exp = status.StackExpectation(reshards=["shards a, b recorded"], changing_run=holder)
        assert status.collect_until(exp, None, wait_s=300, sleep=slept.append) == [row]
        assert slept == [], holder


def test_status_wait_waits_for_the_up_handing_over_then_expects_the_layout_it_recorded(
    tmp_path, monkeypatch
):
    # status --wait begun while a whole up hands over (from shards a, b to a, b, c): its first
    # round expects the hand-over (old and new owners). The up records the new layout and lets
    # the old owners go; the next round is planned anew and expects each host of the new layout
    # from its own shard alone, not the hand-over's union.
    import contextlib

    from deployer.monitoring import status
    from deployer.monitoring.check import OK, Check

    converged(tmp_path, TWO)
    (tmp_path / "inventory.yml").write_text(inventory(THREE))
    inv, site = tmp_path / "inventory.yml", tmp_path / "site.yml"
    seen: list[status.StackExpectation] = []

    def collect(exp, *_, **__):
        seen.append(exp)
        return [status.reshard_check(c, exp.changing_run) for c in exp.reshards] or [
            Check("prometheus", "prom01", "ready", OK)
        ]

    monkeypatch.setattr(status, "collect", collect)
    up = contextlib.ExitStack()
    up.enter_context(run_lock.changing(inv, "up"))

    slept: list[float] = []

    def up_finishes(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:  # a round planned anew during the hand-over, then the up settles
            converged(tmp_path, THREE)  # its first pass, then the layout recorded
            up.close()

    first = status.load_expectation(inv, site=site)
    handing_over = {r: {t.node for t in ts if t.job == "dcgm"}
                    for r, ts in first.replica_targets.items()}  # fmt: skip
    got = status.collect_until(first, None, wait_s=300, sleep=up_finishes,
                               replan=lambda: status.load_expectation(inv, site=site))  # fmt: skip
    assert [c.ok for c in got] == [True] and len(seen) == 3
    assert seen[0].reshards and seen[0].changing_run.startswith("up, pid ")
    # planned again while the up still hands over: the same expectation
    assert (seen[1].reshards, seen[1].replica_targets) == (seen[0].reshards, first.replica_targets)
    after = seen[2]
    assert after.reshards == [] and after.changing_run is None
    settled = {r: {t.node for t in ts if t.job == "dcgm"}
               for r, ts in after.replica_targets.items()}  # fmt: skip
    assert settled == dcgm_hosts(tmp_path, THREE)  # up's second pass: each shard's own hosts
    assert settled["prom01"] < handing_over["prom01"]  # the moved hosts no longer expected


def test_a_host_a_later_round_plans_is_opened_with_its_own_ssh_settings(monkeypatch):
    # the inventory gained gpu99 while status waited on a re-shard: the host pool, made from
    # the first round's expectation, opens it from the round that planned it
    from deployer.connection import SSHTarget
    from deployer.monitoring import status
    from deployer.monitoring.check import OK, PENDING, Check

    first = status.StackExpectation(reshards=["shards a, b recorded"],
                                    changing_run="up, pid 7, since then")  # fmt: skip
    first.ssh["gpu01"] = SSHTarget(name="gpu01", address="192.0.2.1")
    later = status.StackExpectation()
    later.ssh["gpu99"] = SSHTarget(name="gpu99", address="192.0.2.99")
    opened: list[SSHTarget] = []
    monkeypatch.setattr(status, "SSHConnection", opened.append)
    pool = status.open_hosts(first)
    rounds = [[Check("prometheus", "*", status.RESHARD_CHECK, PENDING)],
              [Check("gpu", "gpu99", "driver", OK)]]  # fmt: skip

    def collect(exp, fetch, hosts, **_):
        if not exp.reshards:
            hosts("gpu99")
        return rounds.pop(0)

    monkeypatch.setattr(status, "collect", collect)
    got = status.collect_until(first, None, pool.get, wait_s=300, sleep=lambda _: None,
                               replan=lambda: later)  # fmt: skip
    assert got[0].ok and [t.address for t in opened] == ["192.0.2.99"]
