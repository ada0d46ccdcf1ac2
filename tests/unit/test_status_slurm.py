"""``status`` with Slurm: the inventory variables, the rows judged from what Slurm 22.05 said (the
real captures of tests/fixtures/slurm/) and from the GPUs' use over the window, and the reads
themselves (only read-only commands, on the pooled connection of the Slurm host)."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from deployer.connection import ScriptedConnection
from deployer.errors import HostUnreachable, InputError
from deployer.monitoring import slurm, status
from deployer.monitoring.check import FAILED, OK, to_json
from deployer.monitoring.http import Response
from deployer.monitoring.rollouts import HostStep, RunInfo
from deployer.monitoring.slurm import (
    GpuUse,
    SlurmExpectation,
    SlurmNode,
    SlurmObservation,
    checks,
    expect_slurm,
    observe,
    usage_queries,
    use_check,
)
from tests.unit.test_slurm_state import FIXTURES, capture, captured_view

RUN = "20261201T113000Z-580.126.20-ab12"  # the run named in the captures' gpu04 reason
INV = "/srv/inventory/hosts.yml"
IDLE = GpuUse("GPU-idle", 0.0, 0.0, 0.0, 2.0)
BUSY = GpuUse("GPU-busy", 95.0, 100.0, 30000.0, 30000.0)


def opted(**extra: Any) -> dict[str, Any]:
    return {"gpumon_scheduler": "slurm", "gpumon_slurm_host": "mon01", **extra}


def nodes(*hosts: str, **kw: Any) -> list[SlurmNode]:
    return [SlurmNode(h, h, **kw) for h in hosts]


def expectation(*hosts: str, window: str = "10m", window_s: float = 600) -> SlurmExpectation:
    return SlurmExpectation({"mon01": nodes(*hosts)}, window, window_s, INV)


def usage(node: str, **by_gpu: GpuUse) -> dict[tuple[str, int], GpuUse]:
    return {(node, int(i.removeprefix("g"))): u for i, u in by_gpu.items()}


def idle_node(node: str, count: int) -> dict[tuple[str, int], GpuUse]:
    return {(node, i): IDLE for i in range(count)}


def judged(scenario: str, exp: SlurmExpectation, **obs: Any) -> list:
    observation = SlurmObservation(views={"mon01": captured_view(scenario)}, **obs)
    return checks(exp, observation)


def row(rows: list, host: str, check: str):
    return next(c for c in rows if c.host == host and c.check == check)


# ---------------------------------------------------------------- the inventory's variables


def test_no_gpu_host_setting_gpumon_scheduler_means_no_slurm_checks():
    assert expect_slurm({"gpu01": {}, "gpu02": {"gpumon_scheduler": "none"}}, {"gpu01"}) is None


def test_slurm_hosts_are_grouped_by_where_slurm_is_read_with_the_drain_hook_s_node_names():
    exp = expect_slurm(
        {
            "gpu01": opted(),
            "gpu02": opted(slurm_node_name="n002"),
            "gpu03": {"gpumon_scheduler": "slurm"},
        },
        {"gpu01", "gpu02", "gpu03", "mon01"},
        INV,
    )
    assert exp is not None
    assert [(n.host, n.node) for n in exp.clusters["mon01"]] == [
        ("gpu01", "gpu01"),
        ("gpu02", "n002"),
    ]
    assert [n.host for n in exp.clusters["controller"]] == ["gpu03"]  # the default: here
    assert (exp.window, exp.window_s, exp.inventory) == ("10m", 600, INV)
    assert (
        exp.clusters["mon01"][0].busy_percent == 10 and exp.clusters["mon01"][0].busy_fb_mib == 512
    )


def test_thresholds_and_the_window_come_from_the_variables_as_strings_from_extra_vars():
    exp = expect_slurm(
        {"gpu01": opted(gpumon_slurm_gpu_busy_percent="25", gpumon_slurm_gpu_busy_fb_mib="2048",
                        gpumon_slurm_gpu_window="1h30m")},
        {"mon01"},
    )  # fmt: skip
    n = exp.clusters["mon01"][0]
    assert (n.busy_percent, n.busy_fb_mib, exp.window_s) == (25, 2048, 5400)


@pytest.mark.parametrize(
    ("variables", "key", "words"),
    [
        ({"gpumon_scheduler": "slrum"}, "gpumon_scheduler", "unknown scheduler 'slrum'"),
        (opted(gpumon_slurm_host="login9"), "gpumon_slurm_host", "'login9' is not an inventory host"),
        (opted(gpumon_slurm_gpu_window="10 minutes"), "gpumon_slurm_gpu_window", "not a Prometheus duration"),
        (opted(gpumon_slurm_gpu_window="0"), "gpumon_slurm_gpu_window", "longer than 0"),
        (opted(gpumon_slurm_gpu_busy_percent="high"), "gpumon_slurm_gpu_busy_percent", "not a number"),
        (opted(gpumon_slurm_gpu_busy_percent=150), "gpumon_slurm_gpu_busy_percent", "out of range"),
        (opted(gpumon_slurm_gpu_busy_fb_mib=0), "gpumon_slurm_gpu_busy_fb_mib", "out of range"),
    ],
)  # fmt: skip
def test_a_bad_variable_is_an_input_error_naming_the_host_and_the_variable(variables, key, words):
    with pytest.raises(InputError) as err:
        expect_slurm({"gpu07": variables}, {"mon01", "gpu07"})
    assert err.value.key == key
    assert "gpu07" in str(err.value) and words in str(err.value)


def test_two_windows_in_one_inventory_are_an_input_error_naming_both():
    with pytest.raises(InputError, match=r"gpu01=10m.*gpu02=5m"):
        expect_slurm({"gpu01": opted(), "gpu02": opted(gpumon_slurm_gpu_window="5m")}, {"mon01"})


# ---------------------------------------------------------------- node states


def test_a_node_in_service_is_ok_with_its_state_and_allocated_gpus():
    rows = judged("busy", expectation("gpu01"), usage=idle_node("gpu01", 8))
    assert row(rows, "gpu01", "in service").state == OK
    assert row(rows, "gpu01", "in service").detail == "mixed; 1/8 GPUs allocated"


def test_a_rollout_s_drain_is_ok_while_its_controller_still_drives_the_run():
    run = RunInfo(RUN, True, f"/runs/{RUN}", driven=True, status="running",
                  hosts={"gpu04": HostStep("waiting_jobs")})  # fmt: skip
    c = row(judged("busy", expectation("gpu04"), runs={RUN: run}), "gpu04", "drained by a rollout")
    assert c.state == OK
    assert c.detail.startswith(f"draining by run {RUN}, in progress, host at step waiting_jobs")


def test_a_rollout_s_drain_left_by_a_controller_that_died_fails_with_the_resume_command():
    run = RunInfo(RUN, True, f"/runs/{RUN}", driven=False, status="running", inventory=INV,
                  hosts={"gpu04": HostStep("waiting_jobs")})  # fmt: skip
    c = row(judged("busy", expectation("gpu04"), runs={RUN: run}), "gpu04", "drained by a rollout")
    assert c.state == FAILED
    assert "(root, 2026-12-01T11:38:53)" in c.detail  # who drained it and when, as Slurm says
    assert f"by run {RUN}, which died mid-run, host at step waiting_jobs" in c.detail
    assert c.detail.endswith(f"resume it: gpumon-deploy upgrade-driver -i {INV} --resume {RUN}")


def test_a_rollout_interrupted_or_stopped_that_left_the_node_drained_fails_with_the_resume():
    run = RunInfo(RUN, True, "/r", status="stopped", stop_reason="--max-failures 1 reached",
                  inventory=INV)  # fmt: skip
    c = row(judged("busy", expectation("gpu04"), runs={RUN: run}), "gpu04", "drained by a rollout")
    assert c.state == FAILED
    assert "which was stopped (--max-failures 1 reached)" in c.detail
    assert f"--resume {RUN}" in c.detail


def test_a_finished_rollout_that_failed_the_host_left_it_drained_on_purpose_still_a_failure():
    run = RunInfo(RUN, True, "/r", status="finished", inventory=INV,
                  hosts={"gpu04": HostStep("failed", "validating", "dcgmi diag -r 2 failed")})  # fmt: skip
    c = row(judged("busy", expectation("gpu04"), runs={RUN: run}), "gpu04", "drained by a rollout")
    assert c.state == FAILED
    assert "failed at step validating: dcgmi diag -r 2 failed; left drained on purpose" in c.detail
    assert "scontrol update nodename=gpu04 state=resume" in c.detail


def test_a_rollout_s_drain_with_no_record_here_fails_saying_where_it_looked():
    run = RunInfo(RUN, found=False, where=f"/root/.local/state/gpumon-deploy/runs/{RUN}")
    c = row(judged("busy", expectation("gpu04"), runs={RUN: run}), "gpu04", "drained by a rollout")
    assert c.state == FAILED
    assert f"no record in /root/.local/state/gpumon-deploy/runs/{RUN}" in c.detail
    assert f"gpumon-deploy upgrade-driver -i {INV} --resume {RUN}" in c.detail


def test_an_administrator_s_drain_is_shown_with_its_reason_and_is_not_a_failure():
    rows = judged("busy", expectation("gpu06"), usage=idle_node("gpu06", 2))
    c = row(rows, "gpu06", "drained by an administrator")
    assert c.state == OK
    assert c.detail == "draining: 'XID 79 in burn-in' (root, 2026-12-01T11:39:02); not a rollout's"


def test_a_node_down_in_slurm_is_shown_with_its_reason_and_is_not_a_failure():
    c = row(judged("ending", expectation("gpu03")), "gpu03", "down in Slurm")
    assert (c.state, c.detail) == (
        OK,
        "down: 'cable swap' (root, 2026-12-01T11:39:56); not a rollout's",
    )


def test_a_host_slurm_does_not_know_fails_naming_the_variable():
    exp = SlurmExpectation({"mon01": [SlurmNode("gpu09", "gpu09")]}, "10m", 600)
    c = row(judged("idle", exp), "gpu09", "known to Slurm")
    assert c.state == FAILED and "set slurm_node_name" in c.detail


def test_slurm_that_could_not_be_read_is_one_failure_for_its_host():
    obs = SlurmObservation(
        views={
            "mon01": "`sinfo ...` exited 1: slurm_load_partitions: Unable to contact slurm controller"
        }
    )
    rows = checks(expectation("gpu01", "gpu02"), obs)
    assert [(c.host, c.check, c.state) for c in rows] == [("mon01", "read Slurm", FAILED)]
    assert "Unable to contact slurm controller" in rows[0].detail


# ---------------------------------------------------------------- GPU use against the allocation


def use(scenario: str, host: str, used: dict, **node_kw: Any):
    view = captured_view(scenario)
    return use_check(SlurmNode(host, host, **node_kw), view, used, [], "10m", 600)


def test_idle_gpus_nobody_holds_and_busy_gpus_a_job_holds_are_as_they_should_be():
    used = idle_node("gpu02", 8) | usage("gpu02", g0=BUSY, g1=BUSY, g2=BUSY)  # job 3 holds 0-2
    c = use("busy", "gpu02", used)
    assert c.state == OK
    assert c.detail == "8 GPUs, 3 allocated; none busy outside a job over the last 10m"


def test_a_gpu_busy_for_the_whole_window_with_no_slurm_job_fails_naming_it():
    used = idle_node("gpu01", 8) | usage("gpu01", g5=BUSY)
    c = use("busy", "gpu01", used)
    assert c.state == FAILED
    assert c.detail.startswith(
        "GPU 5 (GPU-busy) busy with no Slurm job over the last 10m: util 95%-100%, memory 30000-30000 MiB"
    )


def test_memory_held_with_no_compute_is_busy_a_process_left_behind():
    leftover = GpuUse("GPU-x", 0.0, 0.0, 40000.0, 40000.0)
    c = use("idle", "gpu01", idle_node("gpu01", 8) | usage("gpu01", g3=leftover))
    assert c.state == FAILED and "GPU 3 (GPU-x) busy with no Slurm job" in c.detail


def test_a_mig_gpu_without_a_utilization_record_is_judged_on_its_memory():
    # a GPU in MIG mode has no DCGM_FI_DEV_GPU_UTIL; without gr_engine_active either, the
    # utilization record has no series for it, and its memory (the sum of its instances) decides
    mig = GpuUse("GPU-mig", None, None, 1080.0, 1080.0)
    c = use("idle", "gpu05", usage("gpu05", g0=mig, g1=IDLE))
    assert c.state == FAILED
    assert "GPU 0 (GPU-mig) busy with no Slurm job over the last 10m: util n/a-n/a" in c.detail
    assert "GPU 1 " not in c.detail


def test_a_gpu_busy_for_part_of_the_window_only_is_not_a_finding():
    ending = GpuUse("GPU-e", 0.0, 100.0, 0.0, 30000.0)  # a job that ended within the window
    assert use("idle", "gpu01", idle_node("gpu01", 8) | usage("gpu01", g2=ending)).state == OK


def test_thresholds_are_the_host_s():
    half = GpuUse("GPU-h", 50.0, 55.0, 100.0, 100.0)
    used = idle_node("gpu01", 8) | usage("gpu01", g4=half)
    assert use("idle", "gpu01", used).state == FAILED
    assert use("idle", "gpu01", used, busy_percent=60).state == OK


def test_gpus_a_job_holds_but_that_stayed_idle_are_listed_and_do_not_fail():
    view = captured_view("busy")  # job 2 holds GPU 2 of gpu01, running 74 s
    c = use_check(SlurmNode("gpu01", "gpu01"), view, idle_node("gpu01", 8), [], "1m", 60)
    assert c.state == OK
    assert "GPU 2 held by job 2 (root, running 1m14s) but idle over the last 1m" in c.detail
    assert "not a failure" in c.detail


def test_a_job_younger_than_the_window_is_not_called_idle():
    view = captured_view("busy")  # job 2: 74 s, shorter than the 10m window
    c = use_check(SlurmNode("gpu01", "gpu01"), view, idle_node("gpu01", 8), [], "10m", 600)
    assert c.state == OK and "held by" not in c.detail


def test_a_multi_node_job_s_gpus_are_judged_on_each_node_by_its_own_index():
    view = captured_view("busy")  # job 7: GPU 0 of gpu03 and GPU 0 of gpu05
    c3 = use_check(SlurmNode("gpu03", "gpu03"), view, idle_node("gpu03", 4), [], "1m", 60)
    c5 = use_check(SlurmNode("gpu05", "gpu05"), view, idle_node("gpu05", 2), [], "1m", 60)
    assert "GPU 0 held by job 7 " in c3.detail and "GPU 0 held by job 7 " in c5.detail


def test_gpus_slurm_counts_without_metrics_are_noted():
    c = use("idle", "gpu01", idle_node("gpu01", 7))
    assert c.state == OK and "no metrics for GPU 7 of the 8 Slurm counts" in c.detail


def test_a_node_without_any_gpu_metrics_is_not_compared_saying_why():
    c = use_check(
        SlurmNode("gpu01", "gpu01"),
        captured_view("idle"),
        {},
        ["http://p1:9090: timeout"],
        "10m",
        600,
    )
    assert (c.state, c.detail) == (OK, "not compared: http://p1:9090: timeout")


def test_a_node_whose_slurm_gres_are_mig_instances_is_not_compared_by_index():
    view = slurm.slurm_state.view(
        "tux1|mixed|Unknown|Unknown|none\n",
        "NodeName=tux1 Gres=gpu:a100:1,gpu:a100_3g.20gb:2 GresUsed=gpu:a100:0(IDX:N/A),gpu:a100_3g.20gb:1(IDX:2)\n",
        "",
        "",
    )
    c = use_check(SlurmNode("tux1", "tux1"), view, idle_node("tux1", 2), [], "10m", 600)
    assert c.state == OK and c.detail.startswith("not compared: Slurm schedules MIG instances")


def test_with_counts_only_more_gpus_busy_than_allocated_fails():
    view = slurm.slurm_state.view(
        "n1|mixed|Unknown|Unknown|none\n",
        "NodeName=n1 Gres=gpu:a100:4 GresUsed=gpu:a100:1 State=MIXED\n",
        "",
        "",
    )
    used = idle_node("n1", 4) | usage("n1", g0=BUSY, g3=BUSY)
    c = use_check(SlurmNode("n1", "n1"), view, used, [], "10m", 600)
    assert c.state == FAILED
    assert "2 GPUs busy over the last 10m (GPU 0,3), Slurm allocated 1" in c.detail


# ---------------------------------------------------------------- the queries


def test_the_usage_queries_take_each_gpu_s_lowest_and_highest_value_over_the_window():
    q = usage_queries("10m")
    assert q[("gpu:gpu_utilization:percent", "min")] == (
        'min by (node, gpu, UUID) (min_over_time(gpu:gpu_utilization:percent{job="dcgm"}[10m]))'
    )
    assert q[("gpu:gpu_memory_used_mib:sum", "max")] == (
        'max by (node, gpu, UUID) (max_over_time(gpu:gpu_memory_used_mib:sum{job="dcgm"}[10m]))'
    )
    assert len(q) == 4


# ---------------------------------------------------------------- observing


class Replicas:
    """Prometheus replicas answering the usage queries from per-GPU values."""

    def __init__(self, values: dict[str, dict[tuple[str, int], GpuUse]]) -> None:
        self.values = values  # base url -> (node, gpu) -> use
        self.down: set[str] = set()
        self.asked: list[str] = []

    def __call__(self, url: str) -> Response:
        self.asked.append(url)
        parts = urllib.parse.urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        if base in self.down:
            return Response(0, error=f"no answer from {url}: timed out")
        promql = urllib.parse.parse_qs(parts.query)["query"][0]
        m = re.fullmatch(
            r"(min|max) by \(node, gpu, UUID\) \((?:min|max)_over_time\((\S+)\{job=\"dcgm\"\}\[\w+\]\)\)",
            promql,
        )
        if parts.path != "/api/v1/query" or m is None:
            return Response(404, "not found")
        agg, record = m.groups()
        slot = ("util_" if "utilization" in record else "fb_") + agg
        result = [
            {
                "metric": {"node": n, "gpu": str(i), "UUID": u.uuid},
                "value": [1, str(getattr(u, slot))],
            }
            for (n, i), u in self.values.get(base, {}).items()
            if getattr(u, slot) is not None
        ]
        return Response(
            200,
            json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}),
        )


def slurm_host(scenario: str) -> ScriptedConnection:
    conn = ScriptedConnection(name="mon01")
    for cmd, key in zip(
        slurm.slurm_state.COMMANDS, ("sinfo", "nodes", "squeue", "jobs"), strict=True
    ):
        conn.on(cmd, stdout=capture(scenario, key))
    return conn


def test_slurm_is_read_with_read_only_commands_on_the_slurm_host_s_pooled_connection(tmp_path):
    conn = slurm_host("busy")
    opened: list[str] = []

    def hosts(h: str) -> ScriptedConnection:
        opened.append(h)
        return conn

    obs = observe(expectation("gpu01"), [], Replicas({}), hosts, state_root=tmp_path)
    assert opened == ["mon01"]
    assert conn.commands == list(slurm.slurm_state.COMMANDS)
    assert all(re.match(r"(sinfo|scontrol show|squeue) ", c) for c in conn.commands)
    assert obs.views["mon01"].gpus["gpu01"].allocated_indexes == {2}


def test_a_failing_slurm_command_is_the_read_error_naming_it(tmp_path):
    conn = ScriptedConnection(name="mon01").on(
        "squeue",
        rc=1,
        stderr="squeue: error: Invalid user for SlurmUser slurm, ignored\nslurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
    )
    conn.on("", stdout="")
    obs = observe(expectation("gpu01"), [], Replicas({}), lambda h: conn, state_root=tmp_path)
    assert obs.views["mon01"] == (
        f"`{slurm.slurm_state.SQUEUE}` exited 1: slurm_load_jobs error: Unable to contact "
        "slurm controller (connect failure)"
    )


def test_an_unreachable_slurm_host_is_the_read_error(tmp_path):
    def hosts(h: str):
        raise HostUnreachable(f"{h}: cannot reach 10.0.0.23:22: timed out")

    obs = observe(expectation("gpu01"), [], Replicas({}), hosts, state_root=tmp_path)
    assert obs.views["mon01"] == "mon01: cannot reach 10.0.0.23:22: timed out"


def test_each_gpu_s_use_comes_from_the_first_replica_that_has_it(tmp_path):
    p1, p2 = "http://p1:9090", "http://p2:9090"
    fetch = Replicas({p1: usage("gpu01", g0=BUSY), p2: usage("gpu01", g0=IDLE, g1=IDLE)})
    obs = observe(
        expectation("gpu01"), [p1, p2], fetch, lambda h: slurm_host("idle"), state_root=tmp_path
    )
    assert obs.usage == {("gpu01", 0): BUSY, ("gpu01", 1): IDLE}
    assert obs.usage_errors == []


def test_a_replica_that_does_not_answer_is_noted_and_the_other_answers(tmp_path):
    p1, p2 = "http://p1:9090", "http://p2:9090"
    fetch = Replicas({p2: usage("gpu01", g0=IDLE)})
    fetch.down.add(p1)
    obs = observe(
        expectation("gpu01"), [p1, p2], fetch, lambda h: slurm_host("idle"), state_root=tmp_path
    )
    assert obs.usage == {("gpu01", 0): IDLE}
    assert len(obs.usage_errors) == 1 and obs.usage_errors[0].startswith(f"{p1}: no answer")


def test_the_record_of_a_run_named_in_a_drain_reason_is_looked_up(tmp_path):
    (tmp_path / RUN).mkdir()
    (tmp_path / RUN / "state.json").write_text(json.dumps(
        {"status": "running", "inventory": INV, "hosts": {"gpu04": {"state": "waiting_jobs"}}}
    ))  # fmt: skip
    obs = observe(
        expectation("gpu04"), [], Replicas({}), lambda h: slurm_host("busy"), state_root=tmp_path
    )
    run = obs.runs[RUN]
    assert (run.found, run.driven, run.status, run.inventory) == (True, False, "running", INV)
    assert run.hosts["gpu04"].state == "waiting_jobs"


# ---------------------------------------------------------------- through status' collect


def test_status_lists_the_slurm_rows_after_the_hosts_rows(tmp_path, monkeypatch):
    from tests.unit import test_monitoring_status as tms

    monkeypatch.setenv("GPUMON_ROLLOUT_STATE_DIR", str(tmp_path))
    stack, hosts = tms.CannedStack(), tms.CannedHosts()
    gpus = Replicas({tms.P1: idle_node("gpu01", 8) | usage("gpu01", g6=BUSY)})

    def fetch(url: str) -> Response:
        if "_over_time" in url:
            return gpus(url)
        return stack(url)

    def opener(h: str) -> ScriptedConnection:
        conn = hosts(h)  # mon01, an Alertmanager peer, is also where Slurm is read
        if h == "mon01":
            conn.rules = slurm_host("busy").rules + conn.rules
        return conn

    exp = tms.expectation(slurm=expectation("gpu01"))
    rows = status.collect(exp, fetch, opener, now=lambda: tms.NOW)
    slurm = [(c.host, c.check, c.state) for c in rows if c.component == "slurm"]
    assert slurm == [
        ("gpu01", "in service", OK),
        ("gpu01", "GPU use = Slurm allocation", FAILED),
    ]
    assert [c.component for c in rows].index("slurm") > [c.component for c in rows].index("driver")
    assert [c["component"] for c in to_json(rows)["failed"]] == ["slurm"]


def test_api_only_status_says_slurm_was_not_read():
    from tests.unit import test_monitoring_status as tms

    exp = tms.expectation(slurm=expectation("gpu01"))
    rows = status.collect(exp, tms.CannedStack(), None, now=lambda: tms.NOW)
    c = next(c for c in rows if c.component == "slurm")
    assert (c.check, c.state, c.detail) == ("read Slurm", OK, "skipped (--api-only)")


def test_the_captures_are_where_the_tests_read_them():
    assert (FIXTURES / "SOURCES.md").is_file()
    assert Path(FIXTURES / "busy.nodes.txt").read_text().startswith("NodeName=gpu01 ")


# ---------------------------------------------------------------- from an inventory


SLURM_INVENTORY = """\
all:
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8}
    gpu02: {ansible_host: 192.0.2.12, gpu_model: A100, gpu_count: 4, slurm_node_name: n002}
    prom01: {ansible_host: 192.0.2.21}
    prom02: {ansible_host: 192.0.2.22}
    login01: {ansible_host: 192.0.2.30, ansible_user: slurmops}
  children:
    gpu:
      hosts: {gpu01: {}, gpu02: {}}
      vars: {gpumon_scheduler: slurm, gpumon_slurm_host: login01}
    prometheus: {hosts: {prom01: {}, prom02: {}}}
    alertmanager: {hosts: {prom01: {}, prom02: {}}}
"""


def test_group_vars_opt_the_gpu_hosts_in_and_status_can_reach_the_slurm_host(tmp_path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(SLURM_INVENTORY)
    exp = status.load_expectation(inv, ["gpumon_slurm_gpu_window=15m"])
    assert [(n.host, n.node) for n in exp.slurm.clusters["login01"]] == [
        ("gpu01", "gpu01"),
        ("gpu02", "n002"),
    ]
    assert (exp.slurm.window, exp.slurm.inventory) == ("15m", str(inv))
    assert (exp.ssh["login01"].address, exp.ssh["login01"].user) == ("192.0.2.30", "slurmops")


def test_an_inventory_without_gpumon_scheduler_has_no_slurm_part(tmp_path):
    from tests.unit.test_monitoring_status import INVENTORY

    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    assert status.load_expectation(inv).slurm is None


def test_a_bad_slurm_variable_exits_2_naming_the_host_and_variable_before_any_connection(
    tmp_path, monkeypatch
):
    from click.testing import CliRunner

    from deployer.cli import cli

    inv = tmp_path / "inventory.yml"
    inv.write_text(SLURM_INVENTORY)
    monkeypatch.setattr(status, "open_hosts", lambda exp: pytest.fail("connected"))
    result = CliRunner().invoke(
        cli, ["status", "-i", str(inv), "-e", "gpumon_slurm_gpu_busy_percent=lots"]
    )
    assert result.exit_code == 2, result.output
    assert "gpumon_slurm_gpu_busy_percent" in result.stderr and "gpu01" in result.stderr


class Dropping(ScriptedConnection):
    """A session that drops on its first command."""

    closed_by_caller: bool = False

    def run(self, command: str, **kw: Any):
        raise HostUnreachable("mon01: connection lost: Channel closed.")

    def close(self) -> None:
        self.closed_by_caller = True


def test_a_session_that_drops_mid_read_is_closed_and_the_read_tried_once_more(tmp_path):
    dropped = Dropping(name="mon01")
    answers = iter([dropped, slurm_host("idle")])
    obs = observe(
        expectation("gpu01"), [], Replicas({}), lambda h: next(answers), state_root=tmp_path
    )
    assert dropped.closed_by_caller
    assert not isinstance(obs.views["mon01"], str)


def test_a_session_that_drops_twice_is_the_read_error(tmp_path):
    obs = observe(
        expectation("gpu01"), [], Replicas({}), lambda h: Dropping(name=h), state_root=tmp_path
    )
    assert obs.views["mon01"] == "mon01: connection lost: Channel closed."


def test_slurm_hosts_default_runs_the_commands_on_this_machine(tmp_path, monkeypatch):
    # Slurm's client commands on the controller's PATH, answering with the captured output
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "sinfo": f"cat {FIXTURES}/busy.sinfo.txt",
        "squeue": f"cat {FIXTURES}/busy.squeue.txt",
        "scontrol": (
            f'case "$2" in node) cat {FIXTURES}/busy.nodes.txt;; '
            f"job) cat {FIXTURES}/busy.jobs.txt;; *) exit 1;; esac"
        ),
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    exp = SlurmExpectation({"controller": nodes("gpu02")}, "10m", 600)

    obs = observe(exp, [], Replicas({}), lambda h: pytest.fail(f"opened {h}"), state_root=tmp_path)
    assert obs.views["controller"].gpus["gpu02"].allocated_indexes == {0, 1, 2}
