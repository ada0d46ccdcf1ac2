"""Two Prometheus shards of two replicas on a lab of their own (topologies/sharded.yml): the
product splits the GPU and node targets between the pairs in each pair's file_sd.

- ``up`` of one pair (prom01, prom02), then of the inventory whose replicas set
  ``prometheus_shard`` (a, a, b, b): while it hands over, the pair keeps every host and the new
  pair (prom03, prom04) takes only its own shard's; then ``status``: green, with the rows proving
  every target is scraped by exactly one shard, by both replicas;
- a second ``up`` of the same inventory, started while the sharded one waits between its passes:
  refused at once (exit 2) naming the first; ``status`` then: a failed ``re-shard finished`` row
  naming the ``up`` (its pid) that holds the inventory's lock; another tier's shard layout record: ``status`` shows
  it as its one failed row, ``up`` refuses it and no replica's targets file changes;
- ``upgrade-driver`` of one GPU host: validated by its own shard's pair alone, which sees its
  GPUs with the new driver (the other pair never scrapes it);
- each replica's active targets: the two shards' dcgm/node targets are disjoint and together
  every host; both replicas of a shard scrape the same; each replica's external labels carry its
  shard;
- both replicas of shard b stopped: ``status`` fails naming them, shard a still scrapes all of its
  targets and fires PrometheusReplicaDown for them;
- two GPU hosts added to the inventory and ``targets`` run: no existing target moves to another
  shard, each new one is in exactly one;
- the federation tier (``gpumon_global_tier: both``, the global pair mon01 + mon02): each global
  replica holds every shard's ``cluster_model:`` records from both replicas of the shard, its
  global records count each GPU once (the raw federated records twice), its view of each shard
  (what ``status`` holds a rollout's missing GPUs to) is that shard's GPUs, and the global view of
  the store returns each GPU once across the shards; with shard b stopped, the global pair fires
  PrometheusShardUnreachable for b and its records still hold every GPU of shard a;
- the tier re-sharded by rack: before ``up`` runs, ``upgrade-driver`` of the new inventory is
  refused (exit 2) naming the record, with no run started and the host's driver as it was, and
  ``status`` has a failed ``re-shard finished`` row naming it; then
  one ``up`` moves hosts with none unscraped for more than an interval and no replica restarted.

The lab is ``<session lab name>-shards`` (its own bridge and subnet), brought up here and taken
down at the end unless ``GPUMON_LAB_KEEP=1``; ``GPUMON_SHARDS_LAB=<name>`` uses a lab of that
name that is already up with this topology instead.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.lab import Lab
from deployer.lab.lab import for_lab_name
from deployer.lab.topology import load_topology
from deployer.monitoring import checks_global
from deployer.monitoring.http import http_fetch
from deployer.monitoring.remote_write import seconds
from tests.integration.labtools import CLI, invocation, run_cli, wait_until

pytestmark = pytest.mark.lab

TOPOLOGY = Path(__file__).parent / "topologies" / "sharded.yml"
SHARD_OF = {"prom01": "a", "prom02": "a", "prom03": "b", "prom04": "b"}
SHARDED_JOBS = ("dcgm", "node")
GLOBAL_PAIR = ("mon01", "mon02")


def bring_up(lab: Lab) -> None:
    lab.up(for_lab_name(load_topology(TOPOLOGY), lab.name))


@pytest.fixture(scope="module")
def slab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    name = os.environ.get("GPUMON_SHARDS_LAB")
    if name:
        yield Lab(name)
        return
    request.getfixturevalue("lab")  # the session's lab decides whether labs run here at all
    lab = Lab(f"{os.environ.get('GPUMON_LAB_NAME') or 'default'}-shards")
    bring_up(lab)
    yield lab
    if os.environ.get("GPUMON_LAB_KEEP") != "1":
        lab.down()


def sharded_inventory(lab: Lab, where: Path, *, one_pair: bool = False) -> Path:
    """The lab's inventory with each replica's shard (its group_vars beside it, as the lab's),
    the tier's layout recorded beside it. ``one_pair``: prom01 and prom02 the tier's only
    replicas, no shards (``one-pair.yml``)."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    tier = data["all"]["children"]["monitoring"]["children"]["prometheus"]
    if one_pair:
        tier["hosts"] = {h: {} for h in PAIR}
    else:
        for host, shard in SHARD_OF.items():
            data["all"]["hosts"][host]["prometheus_shard"] = shard
    settings = data["all"].setdefault("vars", {})
    settings["gpumon_global_tier"] = "both"
    settings["prometheus_shard_record"] = str(where / "shard-layout.json")
    where.mkdir(parents=True, exist_ok=True)
    link = where / "group_vars"
    if not link.exists():
        link.symlink_to(lab.inventory_path.parent / "group_vars")
    path = where / ("one-pair.yml" if one_pair else "inventory.yml")
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def inventory(slab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharded_inventory(slab, tmp_path_factory.mktemp("sharded"))


PAIR = ("prom01", "prom02")
#: "during"/"after" -> replica -> the GPU hosts in its dcgm targets file: while the first sharded
#: ``up`` waited between its passes, and once it finished
HAND_OVER: dict[str, dict[str, set[str]]] = {}
#: what the sharded ``up`` said of the re-shard
NOTES: list[str] = []
#: a second ``up`` of the same inventory, started while the sharded ``up`` waited between passes
SECOND_UP: list[subprocess.CompletedProcess[str]] = []
#: one round of ``status`` then, and the sharded ``up``'s pid
STATUS_DURING: list[subprocess.CompletedProcess[str]] = []
#: a ``status --wait`` begun then, left to follow the ``up`` to its end
STATUS_WAITING: list[subprocess.Popen[str]] = []
UP_PID: list[int] = []


def dcgm_file(lab: Lab, replica: str) -> set[str]:
    got = lab.ssh(replica, "cat /etc/prometheus/file_sd/dcgm.json")
    assert got.returncode == 0, got.stderr
    return {group["labels"]["node"] for group in json.loads(got.stdout)}


@pytest.fixture(scope="module", autouse=True)
def _no_status_left_waiting(slab: Lab) -> Iterator[None]:
    """A ``status --wait`` the module's tests did not collect (the fixture failed after it
    began) does not outlive them, nor the lab."""
    yield
    for waiting in STATUS_WAITING:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()


@pytest.fixture(scope="module")
def deployed(slab: Lab, inventory: Path) -> None:
    """One pair first (prom01, prom02), then the two shards: the sharded ``up`` hands over from
    the pair, and the replicas' targets files are read while it waits between its passes."""
    one = sharded_inventory(slab, inventory.parent, one_pair=True)
    proc = run_cli("up", "-i", str(one), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    up = subprocess.Popen([*CLI, "up", "-i", str(inventory)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    UP_PID[:] = [up.pid]
    said: list[str] = []
    failed: list[BaseException] = []

    def read_while_waiting() -> None:
        assert up.stderr is not None
        for line in up.stderr:
            said.append(line)
            if line.startswith("NOTE re-shard") and "waiting" in line:
                try:
                    HAND_OVER["during"] = {r: dcgm_file(slab, r) for r in SHARD_OF}
                    # a second operator's up while this one is mid re-shard (deployer/run_lock.py)
                    SECOND_UP.append(run_cli("up", "-i", str(inventory), timeout=120))
                    STATUS_DURING.append(
                        run_cli("status", "-i", str(inventory), "--output", "json", timeout=300)
                    )
                    waiting = [*CLI, "status", "-i", str(inventory), "--output", "json"]
                    pipe = subprocess.PIPE
                    waited = subprocess.Popen([*waiting, "--wait", "600"], stdout=pipe, stderr=pipe,
                                              text=True)  # fmt: skip
                    STATUS_WAITING.append(waited)
                except BaseException as exc:  # kept for the test's message, not lost in the thread
                    failed.append(exc)

    # stderr is this thread's alone: communicate() would read it too, and a line it took (the
    # NOTE) never reached the reader, which read as "handed nothing over" (a CI run of 3d629a6)
    reader = threading.Thread(target=read_while_waiting)
    reader.start()
    try:
        assert up.stdout is not None
        out = up.stdout.read()
        up.wait(timeout=1500)
    finally:
        reader.join()
    assert up.returncode == 0, out[-3000:] + "".join(said)[-3000:]
    assert not failed, f"reading the targets files during the hand-over: {failed[0]!r}"
    NOTES[:] = [line.strip() for line in said if line.startswith("NOTE re-shard")]
    HAND_OVER["after"] = {r: dcgm_file(slab, r) for r in SHARD_OF}


def replicas(lab: Lab) -> dict[str, str]:
    return {h.name: f"http://{h.address}:9090" for h in lab.hosts if "prometheus" in h.groups}


def active(url: str) -> dict[str, set[str]]:
    """job -> the ``node`` labels of the replica's active targets."""
    r = http_fetch(f"{url}/api/v1/targets?state=active")
    assert r.error is None and r.status == 200, r
    out: dict[str, set[str]] = {}
    for t in r.json()["data"]["activeTargets"]:
        out.setdefault(t["labels"]["job"], set()).add(t["labels"].get("node", ""))
    return out


def external_labels(url: str) -> dict[str, Any]:
    r = http_fetch(f"{url}/api/v1/status/config")
    assert r.error is None and r.status == 200, r
    return yaml.safe_load(r.json()["data"]["yaml"])["global"]["external_labels"]


def shard_split(lab: Lab) -> dict[str, dict[str, set[str]]]:
    """shard -> job -> nodes, checked equal on both replicas of each shard."""
    seen = {name: active(url) for name, url in replicas(lab).items()}
    out: dict[str, dict[str, set[str]]] = {}
    for name, jobs in seen.items():
        mine = {j: jobs.get(j, set()) for j in SHARDED_JOBS}
        shard = SHARD_OF[name]
        if shard in out:
            assert out[shard] == mine, f"{name} scrapes other targets than its shard peer"
        out[shard] = mine
    return out


def test_from_one_pair_the_pair_keeps_every_host_until_the_new_pair_scrapes_its_own(
    slab: Lab, deployed: None
):
    # the new replicas scraped nothing before: their own shard's hosts only, not the pair's load
    assert "during" in HAND_OVER, f"the sharded up handed nothing over from the pair: {NOTES}"
    during, after = HAND_OVER["during"], HAND_OVER["after"]
    gpus = {h.name for h in slab.hosts if "gpu" in h.groups}
    assert during["prom01"] == during["prom02"] == gpus
    assert during["prom03"] == during["prom04"] == after["prom03"] != gpus
    assert after["prom01"] == after["prom02"] == gpus - after["prom03"]


def test_status_is_green_and_proves_every_target_is_in_exactly_one_shard(
    slab: Lab, inventory: Path, deployed: None
):
    # The hosts moved from the one pair to the shards. A host's own series reach the store
    # without the shard label (deployer/monitoring/remote_write.py), so a moved GPU stays one
    # series there, written by its old and its new owner: no row waits for the old series to
    # leave the store's lookback (it did, 330 s, while they carried the shard label).
    started = time.monotonic()
    proc = run_cli("status", "-i", str(inventory), "--output", "json", "--wait", "300", timeout=420)
    data = json.loads(proc.stdout)
    rows = [c for c in data["checks"] if c["check"].startswith("every target scraped by exactly")]
    assert not data["failed"] and not data["pending"], data["failed"] + data["pending"]
    assert proc.returncode == 0
    print(f"status green after {time.monotonic() - started:.0f} s")
    assert {r["check"] for r in rows} == {
        f"every target scraped by exactly one shard (job {j})" for j in SHARDED_JOBS
    }
    assert all(r["ok"] for r in rows), rows
    # the global view (the store both shards write to) returns each GPU once across the shards,
    # and so do the global pair's records
    once = [c for c in data["checks"] if c["check"] == "every GPU once"]
    assert once and all(c["ok"] for c in once), once
    view = next(c for c in once if c["component"] == "global view")
    assert "one series each" in view["detail"], view
    # the global pair is checked too, as a pair of its own: each replica federates all four
    # shard replicas and loads the global rules
    global_rows = {(c["host"], c["check"]): c for c in data["checks"]
                   if c["component"] == "prometheus_global"}  # fmt: skip
    for name in GLOBAL_PAIR:
        for check in ("ready", "external labels", "rules loaded", "loaded config = on disk"):
            assert global_rows[(name, check)]["ok"], global_rows[(name, check)]
        assert global_rows[(name, "scraping job federate")]["detail"] == "4/4 up"
        # and its records count every GPU of the inventory once
        total = gpus_of(slab)
        assert global_rows[(name, "every GPU once")]["detail"] == (
            f"{total}/{total} GPUs (global_cluster:gpus:count)"
        )
    assert global_rows[("*", "replicas evaluate the same rules")]["ok"]


def test_a_second_up_while_one_re_shards_is_refused_naming_it_and_touches_nothing(
    slab: Lab, deployed: None
):
    # The sharded up (above) converged and handed over as if alone: the second one was refused
    # at once, before reading a fact, with the first one's pid in its message.
    [second] = SECOND_UP
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert "another gpumon-deploy run is changing the hosts of this inventory" in second.stderr
    assert "(up, pid " in second.stderr and second.stdout == ""


def test_status_during_the_hand_over_names_the_up_that_is_handing_over(slab: Lab, deployed: None):
    # status read the lock's holder from /proc/locks (taking nothing: the up went on, above)
    [during] = STATUS_DURING
    rows = [c for c in json.loads(during.stdout)["failed"] if c["check"] == "re-shard finished"]
    assert len(rows) == 1, during.stdout[-3000:] + during.stderr[-2000:]
    detail = rows[0]["detail"]
    assert (
        "one pair of prom01, prom02 recorded, the inventory asks for shards a, b (by host)"
        in detail
    )
    assert f"A run holds this inventory's lock (up, pid {UP_PID[0]}, since " in detail, detail


def test_status_wait_begun_during_the_hand_over_follows_the_up_to_the_layout_it_recorded(
    slab: Lab, deployed: None
):
    # Its first rounds expected the hand-over (the pair keeping every host) and waited on the
    # re-shard row while the up held the lock; once the up recorded the shards, each round was
    # planned anew: it ended green on the shards alone, the pair's moved hosts no longer expected.
    [waiting] = STATUS_WAITING
    out, err = waiting.communicate(timeout=700)
    data = json.loads(out)
    assert waiting.returncode == 0, data["failed"] + data["pending"] + [err[-2000:]]
    assert not [c for c in data["checks"] if c["check"] == "re-shard finished"]
    rows = [c for c in data["checks"] if c["check"].startswith("every target scraped by exactly")]
    assert len(rows) == len(SHARDED_JOBS) and all(r["ok"] for r in rows), rows


def test_status_shows_another_tiers_shard_record_and_up_refuses_it_touching_nothing(
    slab: Lab, inventory: Path, deployed: None
):
    # Another tier (another inventory with the same cluster, on this controller) wrote the
    # record this tier reads: up refuses it before it connects; status shows it as the one failed
    # row and checks the rest of the running stack as if there were no record.
    record = inventory.parent / "shard-layout.json"
    ours = record.read_text()
    theirs = {"format": 1, "shards": [""], "by": "host", "replicas": ["prom11", "prom12"]}
    configs = {r: slab.ssh(r, "md5sum /etc/prometheus/file_sd/dcgm.json").stdout for r in SHARD_OF}
    record.write_text(json.dumps(theirs))
    try:
        # one round: waiting cannot mend the record (the stack was green just before)
        proc = run_cli("status", "-i", str(inventory), "--output", "json", timeout=300)
        data = json.loads(proc.stdout)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert [(c["host"], c["check"]) for c in data["failed"]] == [("*", "shard layout record")]
        assert "another tier's (one pair of prom11, prom12)" in data["failed"][0]["detail"]
        rows = [c for c in data["checks"] if c["check"].startswith("every target scraped by")]
        assert rows and all(r["ok"] for r in rows), rows
        up = run_cli("up", "-i", str(inventory), timeout=300)
        assert up.returncode == 2, up.stdout[-2000:] + up.stderr[-2000:]
        assert "another tier's" in up.stderr and up.stdout == ""
        assert json.loads(record.read_text()) == theirs
        after = {
            r: slab.ssh(r, "md5sum /etc/prometheus/file_sd/dcgm.json").stdout for r in SHARD_OF
        }
        assert after == configs
    finally:
        record.write_text(ours)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    r = http_fetch(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert r.error is None and r.status == 200, r
    return r.json()["data"]["result"]


def global_urls(lab: Lab) -> dict[str, str]:
    return {h.name: f"http://{h.address}:9090" for h in lab.hosts if h.name in GLOBAL_PAIR}


def settled_split(lab: Lab) -> dict[str, dict[str, set[str]]]:
    """The shards' split once both replicas of each shard scrape the same, the inventory's hosts
    only (the replicas take a new targets file one after the other)."""
    names = {h.name for h in lab.hosts}

    def split() -> dict[str, dict[str, set[str]]] | None:
        try:
            got = shard_split(lab)
        except AssertionError:
            return None
        seen = set().union(*(nodes for jobs in got.values() for nodes in jobs.values()))
        return got if seen <= names else None

    return wait_until("the shards' split settled", split, timeout=150, every=5)


def gpus_of(lab: Lab, shard: str | None = None) -> int:
    split = settled_split(lab) if shard else None
    return sum(
        h.gpu_count
        for h in lab.hosts
        if "gpu" in h.groups and (split is None or h.name in split[shard]["dcgm"])
    )


def test_the_global_pair_holds_each_shards_records_from_both_of_its_replicas(
    slab: Lab, deployed: None
):
    want = {(SHARD_OF[r], r) for r in SHARD_OF}
    for name, url in global_urls(slab).items():

        def federated(url: str = url) -> set[tuple[str, str]] | None:
            got = {(s["metric"].get("shard"), s["metric"].get("replica"))
                   for s in query(url, "cluster_model:gpus:count")}  # fmt: skip
            return got if got >= want else None

        # records every evaluation (15s), federated every 30s
        got = wait_until(f"{name} federating both replicas of each shard", federated, 180, 5)
        assert got == want, name


def test_the_global_records_count_each_gpu_once_across_shards_and_replicas(
    slab: Lab, deployed: None
):
    total = gpus_of(slab)
    for name, url in global_urls(slab).items():

        def counted(url: str = url) -> bool:
            got = query(url, "sum(global_cluster:gpus:count)")
            return bool(got) and float(got[0]["value"][1]) == total

        # (until the records of a replica just restarted or reloaded have settled)
        wait_until(f"{name} global GPU count {total}", counted, 180, 5)
        # what it deduplicated: each shard's record once per replica
        raw = query(url, "sum(cluster_model:gpus:count)")
        assert float(raw[0]["value"][1]) == 2 * total, name
        # status' view of each shard (a rollout excuses missing GPUs in their own shard only):
        # the rules' per-shard record, evaluated with the total above
        by_shard = query(url, checks_global.SHARD_RECORD)
        assert checks_global.shard_counts(by_shard, "shard") == {
            s: float(gpus_of(slab, s)) for s in ("a", "b")
        }, name
        # per model: the lab's models, each host's GPUs once
        models = {s["metric"]["gpu_model"]: float(s["value"][1])
                  for s in query(url, "global_cluster_model:gpus:count")}  # fmt: skip
        want: dict[str, float] = {}
        for h in slab.hosts:
            if "gpu" in h.groups:
                want[h.gpu_model] = want.get(h.gpu_model, 0) + h.gpu_count
        assert models == want, name


def test_the_shards_split_the_hosts_disjointly_and_completely(slab: Lab, deployed: None):
    split = shard_split(slab)
    gpu_hosts = {h.name for h in slab.hosts if "gpu" in h.groups}
    every_host = {h.name for h in slab.hosts}
    assert not split["a"]["dcgm"] & split["b"]["dcgm"]
    assert split["a"]["dcgm"] | split["b"]["dcgm"] == gpu_hosts
    assert not split["a"]["node"] & split["b"]["node"]
    assert split["a"]["node"] | split["b"]["node"] == every_host
    for shard in ("a", "b"):
        assert split[shard]["dcgm"] <= split[shard]["node"]  # a host's targets together


def test_each_replicas_external_labels_carry_its_shard(slab: Lab, deployed: None):
    for name, url in replicas(slab).items():
        assert external_labels(url).get("shard") == SHARD_OF[name], name


def test_a_driver_upgrade_in_a_sharded_tier_is_validated_by_the_hosts_own_shard(
    slab: Lab, inventory: Path, deployed: None, tmp_path: Path
):
    # upgrade-driver proves an upgraded host is monitored by asking the replicas that scrape
    # it. The other shard's replicas never do: they were asked too, answered "no target of
    # gpu01", and the upgrade of every host of a sharded tier failed validation at its timeout.
    node = "gpu01"  # H100, at the lab's default 595.45.04: to 580.126.20 (another branch)
    split = settled_split(slab)
    owner = next(shard for shard, jobs in split.items() if node in jobs["dcgm"])
    own = [r for r, s in SHARD_OF.items() if s == owner]
    proc = run_cli("upgrade-driver", "-i", str(inventory), "--to", "580.126.20", "--limit", node,
                   "--drain", "none", "--output", "json", timeout=900,
                   env={"GPUMON_ROLLOUT_STATE_DIR": str(tmp_path / "runs")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    host = report["hosts"][node]
    assert report["status"] == "finished" and host["state"] == "done", host
    seen = next(c for c in host["validation"] if c["check"] == "Prometheus replicas see the host")
    assert seen["ok"] and seen["detail"] == ", ".join(own), seen
    # (validation saw the new driver label there): the other pair has no series of the host
    for name, url in replicas(slab).items():
        found = query(url, f'count(DCGM_FI_DEV_GPU_TEMP{{node="{node}"}})')
        assert bool(found) == (name in own), (name, found)


def test_two_gpu_hosts_added_move_no_existing_target(
    slab: Lab, inventory: Path, deployed: None, tmp_path_factory: pytest.TempPathFactory
):
    before = shard_split(slab)
    data = yaml.safe_load(inventory.read_text())
    # Two new inventory entries: other names for two GPU hosts' exporters (as test_monitoring's
    # new host): new targets for the shards to place, with exporters that answer.
    gpus = sorted(h.name for h in slab.hosts if "gpu" in h.groups)
    added = set()
    for i, gpu in enumerate(gpus[:2]):
        new = f"{gpu}-alias{i}"
        data["all"]["hosts"][new] = dict(data["all"]["hosts"][gpu])
        data["all"]["children"]["gpu"]["hosts"][new] = {}
        added.add(new)
    grown_dir = tmp_path_factory.mktemp("grown")
    (grown_dir / "group_vars").symlink_to(slab.inventory_path.parent / "group_vars")
    grown = grown_dir / "inventory.yml"
    grown.write_text(yaml.safe_dump(data))
    try:
        proc = run_cli("targets", "-i", str(grown), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

        def placed() -> dict[str, dict[str, set[str]]] | None:
            try:  # the replicas take the new files one after the other (serial play, file watch)
                now = shard_split(slab)
            except AssertionError:
                return None
            return now if (now["a"]["dcgm"] | now["b"]["dcgm"]) >= added else None

        after = wait_until("the new hosts in the replicas' targets", placed, timeout=150, every=5)
        for shard in ("a", "b"):
            for job in SHARDED_JOBS:
                assert before[shard][job] <= after[shard][job], (shard, job)
        assert not after["a"]["dcgm"] & after["b"]["dcgm"]
    finally:
        assert run_cli("targets", "-i", str(inventory), timeout=600).returncode == 0


def test_a_stopped_pair_fails_status_and_fires_in_the_other_shard_which_stays_complete(
    slab: Lab, inventory: Path, deployed: None
):
    down = [h for h, s in SHARD_OF.items() if s == "b"]
    urls = replicas(slab)
    of_a = gpus_of(slab, "a")
    try:
        for name in down:
            assert slab.ssh(name, "systemctl stop prometheus", timeout=120).returncode == 0
        proc = run_cli("status", "-i", str(inventory), "--output", "json", timeout=300)
        data = json.loads(proc.stdout)
        failed = {(c["host"], c["check"]) for c in data["checks"] if c["state"] == "failed"}
        assert proc.returncode == 1
        assert {(h, "ready") for h in down} <= failed, failed
        # shard a still scrapes every one of its GPU and node targets (its prometheus job shows
        # shard b's replicas down: that is how it alerts on them)
        wanted = {f"scraping job {j}" for j in SHARDED_JOBS}
        for name in ("prom01", "prom02"):
            rows = [c for c in data["checks"] if c["host"] == name and c["check"] in wanted]
            assert rows and all(c["ok"] for c in rows), rows

        def firing() -> bool:
            r = http_fetch(f"{urls['prom01']}/api/v1/alerts")
            alerts = r.json()["data"]["alerts"] if r.status == 200 else []
            down_at = {a["labels"].get("node") for a in alerts
                       if a["labels"].get("alertname") == "PrometheusReplicaDown"
                       and a["state"] == "firing"}  # fmt: skip
            return set(down) <= down_at

        # the rule's default for: 2m, then one evaluation
        wait_until("PrometheusReplicaDown firing in shard a", firing, timeout=240, every=10)

        # the global pair: shard b unreachable (an alert), shard a's GPUs all still counted
        globals_ = global_urls(slab)

        def shard_b_unreachable() -> bool:
            r = http_fetch(f"{globals_['mon01']}/api/v1/alerts")
            alerts = r.json()["data"]["alerts"] if r.status == 200 else []
            return any(a["labels"].get("alertname") == "PrometheusShardUnreachable"
                       and a["labels"].get("shard") == "b" and a["state"] == "firing"
                       for a in alerts)  # fmt: skip

        # federate every 30s, for: 2m, then one evaluation
        wait_until("PrometheusShardUnreachable{shard=b} firing", shard_b_unreachable, 300, 10)
        # and status says so on the global pair's rows, naming the replicas it cannot federate
        proc = run_cli("status", "-i", str(inventory), "--output", "json", timeout=300)
        data = json.loads(proc.stdout)
        federate = {c["host"]: c for c in data["checks"] if c["component"] == "prometheus_global"
                    and c["check"] == "scraping job federate"}  # fmt: skip
        assert set(federate) == set(globals_), federate
        for row in federate.values():
            assert row["state"] == "failed", row
            assert all(h in row["detail"] for h in down) and "(2/4 up)" in row["detail"], row
        # and that its records count only shard a's GPUs
        once = {c["host"]: c for c in data["checks"] if c["component"] == "prometheus_global"
                and c["check"] == "every GPU once"}  # fmt: skip
        assert set(once) == set(globals_), once
        for row in once.values():
            assert row["state"] == "failed", row
            assert f"counts {of_a} of {gpus_of(slab)} GPUs" in row["detail"], row
            assert f"shard b 0 of {gpus_of(slab) - of_a} GPUs" in row["detail"], row
        for name, url in globals_.items():
            got = query(url, "sum(global_cluster:gpus:count)")
            assert got and float(got[0]["value"][1]) == of_a, (name, got)
            left = {s["metric"].get("shard") for s in query(url, "cluster_model:gpus:count")}
            assert left == {"a"}, (name, left)
    finally:
        for name in down:
            slab.ssh(name, "systemctl start prometheus", timeout=120)


# ---------------------------------------------------------------- re-sharding (last: it leaves
# the layout by rack)


def _scrape_time(text: str) -> float | None:
    """Prometheus' ``lastScrape`` (RFC 3339, nanoseconds) in epoch seconds; None before the first."""
    if text.startswith("0001-"):
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    stamp = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC).timestamp()
    return stamp + (float(f"0.{frac}") if frac else 0.0)


class ScrapeWatch(threading.Thread):
    """Polls every replica's active targets every 2 s; per sharded target (job, node), the longest
    time any poll saw since its last successful scrape by any replica, and its scrape interval."""

    def __init__(self, urls: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.urls, self.stop = urls, threading.Event()
        self.last: dict[tuple[str, str], tuple[float, float]] = {}  # -> (last scrape, interval)
        self.worst: dict[tuple[str, str], tuple[float, float]] = {}  # -> (staleness, interval)
        self.polls = 0

    def run(self) -> None:
        while not self.stop.wait(2.0):
            for url in self.urls.values():
                r = http_fetch(f"{url}/api/v1/targets?state=active", timeout=5)
                if r.error is not None or r.status != 200:
                    continue
                for t in r.json()["data"]["activeTargets"]:
                    key = (t["labels"]["job"], t["labels"].get("node", ""))
                    at = _scrape_time(t.get("lastScrape", "0001-"))
                    if key[0] not in SHARDED_JOBS or t.get("health") != "up" or at is None:
                        continue
                    interval = seconds(t.get("scrapeInterval", "15s"))
                    if key not in self.last or at > self.last[key][0]:
                        self.last[key] = (at, interval)
            now = time.time()
            for key, (at, interval) in self.last.items():
                if now - at > self.worst.get(key, (0.0, interval))[0]:
                    self.worst[key] = (now - at, interval)
            self.polls += 1


def test_a_reshard_is_one_up_that_leaves_no_target_unscraped_and_restarts_no_replica(
    slab: Lab, inventory: Path, deployed: None, tmp_path_factory: pytest.TempPathFactory
):
    urls = replicas(slab)
    before = settled_split(slab)

    def invocations() -> dict[str, str]:
        return {h: invocation(slab, h, "prometheus") for h in urls}

    started = invocations()
    data = yaml.safe_load(inventory.read_text())
    data["all"]["vars"]["prometheus_shard_by"] = "rack"  # racks r1 and r2 each to one shard
    where = tmp_path_factory.mktemp("by-rack")
    (where / "group_vars").symlink_to(slab.inventory_path.parent / "group_vars")
    by_rack = where / "inventory.yml"
    by_rack.write_text(yaml.safe_dump(data))

    # Before up re-shards, a driver rollout of the new layout is refused: a moved host's new
    # owner would not scrape it yet, and the host would fail validation after its reboot.
    record = inventory.parent / "shard-layout.json"
    recorded = record.read_text()
    driver = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
    had = slab.ssh("gpu02", driver).stdout
    runs = tmp_path_factory.mktemp("refused-runs")
    proc = run_cli("upgrade-driver", "-i", str(by_rack), "--to", "580.126.20", "--limit", "gpu02",
                   "--drain", "none", timeout=300,
                   env={"GPUMON_ROLLOUT_STATE_DIR": str(runs)})  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "shard layout is changing" in proc.stderr and str(record) in proc.stderr
    assert "run a whole `gpumon-deploy up` first" in proc.stderr
    assert list(runs.iterdir()) == [] and record.read_text() == recorded
    assert slab.ssh("gpu02", driver).stdout == had
    # and status (one round) says why the moved hosts' new shards do not scrape them yet
    proc = run_cli("status", "-i", str(by_rack), "--output", "json", timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    [row] = [c for c in json.loads(proc.stdout)["failed"] if c["check"] == "re-shard finished"]
    assert row["host"] == "*" and f"{record}: shards a, b (by host) of" in row["detail"], row
    assert "the inventory asks for shards a, b (by rack) of" in row["detail"], row
    assert record.read_text() == recorded

    watch = ScrapeWatch(urls)
    watch.start()
    try:
        proc = run_cli("up", "-i", str(by_rack), timeout=1500)
    finally:
        time.sleep(10)  # the second pass' file_sd taken by every replica
        watch.stop.set()
        watch.join()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "NOTE re-shard" in proc.stderr
    print(f"re-shard watch: {watch.polls} polls; worst staleness per target "
          f"{ {f'{j}/{n}': round(s, 1) for (j, n), (s, _) in sorted(watch.worst.items())} }")  # fmt: skip
    assert watch.polls > 10
    # "never unscraped for more than one interval": since its last scrape, at most one interval
    # passed beyond the one a target waits anyway (and two polls' granularity)
    gaps = {k: (round(s, 1), i) for k, (s, i) in watch.worst.items() if s > 2 * i + 4}
    assert gaps == {}, gaps
    after = settled_split(slab)
    racks = {h.name: h.vars.get("rack") for h in slab.hosts if "gpu" in h.groups}
    for shard in ("a", "b"):
        assert len({racks[g] for g in after[shard]["dcgm"]}) <= 1, after  # a rack stays together
    assert after != before  # hosts did move
    assert invocations() == started  # no replica restarted
