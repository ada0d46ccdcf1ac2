"""What people see: the live table (drawn with rich on a terminal, one line per transition
elsewhere), the --check plan text, and the JSON report's summary."""

from __future__ import annotations

import io

from deployer.rollout.options import RolloutOptions
from deployer.rollout.state import HostRecord, RunRecord
from deployer.rollout.view import LiveView, plan_text, report, table


def record() -> RunRecord:
    rec = RunRecord(
        run_id="R1",
        inventory="/inv.yml",
        target={"requested": "580", "branch": "580", "version": "580.126.20", "listed": True},
        options=RolloutOptions(max_unavailable_hosts=2, max_failures=1, canary=1),
        batches=[["g1"], ["g2"]],
        hosts={
            "g1": HostRecord(host="g1", batch=0, state="done", history=[["done", 1.0]]),
            "g2": HostRecord(host="g2", batch=1, state="failed", reason="validation failed: x"),
            "g3": HostRecord(
                host="g3", batch=-1, state="skipped", reason="already runs 580.126.20"
            ),
        },
    )
    rec.status, rec.stop_reason = "stopped", "--max-failures 1 reached"
    return rec


def test_the_table_lists_every_host_with_its_batch_state_and_reason():
    out = io.StringIO()
    from rich.console import Console

    Console(file=out, width=200).print(table(record()))
    text = out.getvalue()
    assert "1 (canary)" in text and "validation failed: x" in text
    assert "g3" in text and "skipped" in text and "already runs 580.126.20" in text


def test_without_a_terminal_each_transition_is_one_line():
    out = io.StringIO()
    with LiveView(out, live=False) as view:
        view.changed(record(), "g2")
    assert out.getvalue().rstrip().endswith("g2: failed (validation failed: x)")


def test_the_live_table_draws_on_a_terminal():
    out = io.StringIO()
    with LiveView(out, live=True) as view:
        view.changed(record(), "g1")
        view.detail("g1", "rebooting")
    assert "rebooting" in out.getvalue() and "\x1b[" in out.getvalue()


def test_the_report_summarises_states_and_failures():
    data = report(record())
    assert data["summary"] == {
        "status": "stopped",
        "stop_reason": "--max-failures 1 reached",
        "target": "580.126.20",
        "hosts": {"done": ["g1"], "failed": ["g2"], "skipped": ["g3"]},
        "failed": {"g2": "validation failed: x"},
    }
    assert data["hosts"]["g1"]["state"] == "done"


def test_the_plan_text_shows_packages_before_and_after_drain_and_silence():
    host = {
        "before": {
            "driver_installed": "570.133.20", "driver_loaded": "570.133.20",
            "module_flavour": "open", "dcgm_version": "4.6.0",
            "dcgm_package": "datacenter-gpu-manager-4-cuda12", "exporter_version": "4.8.3",
            "fabricmanager_version": "570.133.20",
        },
        "after": {
            "driver_version": "580.126.20", "module_flavour": "open", "cuda_major": 13,
            "dcgm_version": "4.6.0", "dcgm_packages": ["datacenter-gpu-manager-4-core",
            "datacenter-gpu-manager-4-cuda13"], "exporter_tag": "4.6.0-4.8.3",
            "fabricmanager_version": "580.126.20", "install": ["nvidia-open=580.126.20-1"],
            "remove": [], "notes": [],
        },
        "drain": "drain: scontrol update nodename=g1 state=drain reason=x",
        "silence": '{node="g1"} for 120 min on http://am:9093',
        "skip": None,
    }  # fmt: skip
    plan = {
        "target": {"version": "580.126.20", "branch": "580", "requested": "580"},
        "options": {
            "canary": 1, "batch_size": "2", "max_unavailable_hosts": 2, "max_failures": 1,
            "drain": "slurm", "reboot": "auto",
        },
        "unavailable_before": {"g9": "drained before the run (slurm)"},
        "batches": [["g1"]],
        "hosts": {"g1": host},
    }  # fmt: skip
    text = plan_text(plan)
    assert "g1: driver 570.133.20 (loaded 570.133.20, open) -> 580.126.20 (open, CUDA 13)" in text
    assert "datacenter-gpu-manager-4-cuda12) -> 4.6.0 (datacenter-gpu-manager-4-core, " in text
    assert "Fabric Manager 570.133.20 -> 580.126.20" in text
    assert "install: nvidia-open=580.126.20-1" in text
    assert "drain: drain: scontrol" in text and 'silence: {node="g1"}' in text
    assert "out of service before the run: g9" in text
