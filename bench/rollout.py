"""The rollout's own overhead: ``upgrade-driver`` on a lab's GPU hosts, its wall time split into
what the hosts must spend and what the controller adds.

    .venv/bin/gpumon-deploy lab up --name rbench --gpu-nodes 2
    .venv/bin/python -m bench.rollout --lab rbench --runs 2

Before each run (not timed) the GPU hosts are converged at the baseline driver with ``up
--out-of-service`` (and, once, the monitoring tier, so that validation's Prometheus queries and
the silences are real). Each timed run is ``upgrade-driver --to TARGET --limit HOSTS`` with the
defaults (a canary, then batches; reboot ``auto``) and ``GPUMON_SPANS`` set: the product
records its own spans (deployer/spans.py: off, they cost one no-op call). The split, over the
run's timeline from the process start to its exit, gives each instant to the first of:

- the hosts' side: ``remote`` (a command on a host, round trip included: package installs, the
  facts, the checks), ``reboot`` (reboot and the wait for the new boot), ``wait`` (the pauses
  between polls: a scrape the controller waits for, GPU jobs to end), ``http`` (validation's
  queries to Prometheus);
- the controller: ``connect``, ``load`` (inventory, site, roles), ``state_write`` (the run's
  state file after every transition), ``silence`` (the silencing and unsilencing steps, HTTP to
  Alertmanager), ``plan`` (planning each converge), then ``steps`` (inside a step, none of the
  above: the engine's own work between commands) and ``start+exit`` (before the first span and
  after the last: Python, imports, preflight bookkeeping, the report).

The controller's share, divided by the hosts rolled, is its cost per host (issue 20: < 1 s).
Writes ``bench/results/rollout-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.converge import machine, tool_versions
from bench.measure import run_measured, write_result
from bench.tools import GPUMON

HOST_SIDE = ("remote", "reboot", "wait", "http")
CONTROLLER = ("connect", "load", "state_write", "silence", "plan", "steps")
ORDER = (*HOST_SIDE, *CONTROLLER)
TARGET_ADDED_PER_HOST_S = 1.0
SILENCE_STEPS = ("step:silencing", "step:unsilencing")


def category(kind: str) -> str:
    if kind in SILENCE_STEPS:
        return "silence"
    if kind.startswith("step:"):
        return "steps"
    return kind


def split(spans: Iterable[Mapping[str, Any]], start: float, end: float) -> dict[str, float]:
    """Seconds of [start, end] given to each category of :data:`ORDER` (the first active at
    each instant wins) and to ``start+exit`` (no span active)."""
    events: list[tuple[float, int, str]] = []
    for s in spans:
        cat = category(str(s["kind"]))
        if cat not in ORDER:
            continue
        a, b = max(start, float(s["start"])), min(end, float(s["end"]))
        if b > a:
            events += [(a, 1, cat), (b, -1, cat)]
    events.sort()
    out = dict.fromkeys((*ORDER, "start+exit"), 0.0)
    active = dict.fromkeys(ORDER, 0)
    t = start
    for when, delta, cat in [*events, (end, 0, "")]:
        if when > t:
            top = next((c for c in ORDER if active[c] > 0), "start+exit")
            out[top] += when - t
            t = when
        if cat:
            active[cat] += delta
    return out


# The controller's time spent once per command, whatever the host count: the interpreter's
# start, imports and exit, and loading the inventory, site and roles.
ONCE = ("start+exit", "load")


def judge(parts: Mapping[str, float], hosts: int) -> dict[str, float]:
    """The hosts' share, the controller's, its part spent once per command and the rest per
    host (what grows with the fleet: the target's "added per host")."""
    host_side = sum(parts.get(c, 0.0) for c in HOST_SIDE)
    controller = sum(v for c, v in parts.items() if c not in HOST_SIDE)
    once = sum(parts.get(c, 0.0) for c in ONCE)
    return {
        "hosts_s": round(host_side, 3),
        "controller_s": round(controller, 3),
        "controller_once_s": round(once, 3),
        "controller_per_host_s": round((controller - once) / max(1, hosts), 3),
    }


def step_table(spans: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Each host's time per rollout step (s)."""
    out: dict[str, dict[str, float]] = {}
    for s in spans:
        if str(s["kind"]).startswith("step:"):
            per = out.setdefault(str(s["host"]), {})
            step = str(s["kind"])[5:]
            per[step] = round(per.get(step, 0.0) + float(s["end"]) - float(s["start"]), 3)
    return out


def cli(args: list[str], env: Mapping[str, str], timeout_s: float = 1800.0) -> Any:
    got = run_measured([str(GPUMON), *args], env=env, timeout_s=timeout_s)
    if got.rc != 0:
        raise SystemExit(
            f"gpumon-deploy {' '.join(args[:3])}... failed rc={got.rc}: {got.stderr[-1500:]}"
        )
    return got


def run(args: argparse.Namespace) -> dict[str, Any]:
    from deployer.lab.lab import Lab

    lab = Lab(args.lab)
    if not lab.hosts:
        raise SystemExit(f"lab {args.lab!r} is not up: gpumon-deploy lab up --name {args.lab}")
    inv = str(lab.inventory_path)
    hosts = args.hosts.split(":")
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    runs_dir = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    env["GPUMON_ROLLOUT_STATE_DIR"] = str(runs_dir)
    print("converging the monitoring tier (not timed)", file=sys.stderr)
    cli(["up", "-i", inv, "--limit", "prometheus:alertmanager"], env)
    runs: list[dict[str, Any]] = []
    for r in range(args.runs):
        print(f"baseline {args.baseline} on {args.hosts} (not timed)", file=sys.stderr)
        cli(
            ["up", "-i", inv, "--limit", args.hosts, "-e", f"nvidia_driver_version={args.baseline}",
             "-e", "nvidia_driver_reboot=if_required", "--out-of-service"],
            env,
        )  # fmt: skip
        spans_file = runs_dir / f"spans-{r}.jsonl"
        run_env = {**env, "GPUMON_SPANS": str(spans_file)}
        argv = ["upgrade-driver", "-i", inv, "--to", args.to, "--limit", args.hosts,
                "--output", "json", *args.extra]  # fmt: skip
        started = time.time()
        got = cli(argv, run_env)
        ended = started + got.wall_s
        spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
        report = json.loads(got.stdout[got.stdout.index("{") :])
        parts = split(spans, started, ended)
        one = {
            "wall_s": round(got.wall_s, 3),
            "cpu_s": round(got.cpu_s, 3),
            "peak_rss_mib": round(got.peak_rss_mib, 1),
            "split_s": {k: round(v, 3) for k, v in parts.items()},
            **judge(parts, len(hosts)),
            "steps_s": step_table(spans),
            "loads": sum(1 for s in spans if s["kind"] == "load"),
            "status": report.get("status"),
        }
        runs.append(one)
        print(
            f"  run {r + 1}: wall {one['wall_s']:.1f}s, hosts {one['hosts_s']:.1f}s, controller "
            f"{one['controller_s']:.2f}s ({one['controller_once_s']:.2f}s once, "
            f"{one['controller_per_host_s']:.2f}s per host)",
            file=sys.stderr,
        )
    return {
        "benchmark": "rollout",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python -m bench.rollout", *sys.argv[1:]]),
        "machine": machine(),
        "versions": tool_versions(),
        "hosts": hosts,
        "baseline": args.baseline,
        "target": args.to,
        "runs": runs,
    }


def render(result: dict[str, Any]) -> str:
    runs = result["runs"]
    if not runs:
        return "no run"
    lines = [f"upgrade-driver on {len(result['hosts'])} hosts, {len(runs)} runs (median, s):"]
    med = {k: statistics.median(r["split_s"][k] for r in runs) for k in runs[0]["split_s"]}
    lines.append(f"  wall {statistics.median(r['wall_s'] for r in runs):.2f}")
    for k, v in med.items():
        side = "hosts" if k in HOST_SIDE else "controller"
        lines.append(f"  {side:<10} {k:<12} {v:8.2f}")
    per_host = statistics.median(r["controller_per_host_s"] for r in runs)
    met = "met" if per_host < TARGET_ADDED_PER_HOST_S else "MISSED"
    once = statistics.median(r["controller_once_s"] for r in runs)
    lines.append(
        f"controller adds {per_host:.2f} s per host (target < {TARGET_ADDED_PER_HOST_S:g} s: "
        f"{met}), and {once:.2f} s once per command (start-up, imports, loading, exit)"
    )
    loads = {r["loads"] for r in runs}
    lines.append(f"load spans per run (inventory once, site and roles once): {sorted(loads)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rollout", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--lab", default="rbench")
    parser.add_argument("--hosts", default="gpu01:gpu02", help="GPU hosts to roll (a --limit)")
    parser.add_argument("--baseline", default="580.65.06")
    parser.add_argument("--to", default="595")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("extra", nargs="*", help="more upgrade-driver options (after --)")
    args = parser.parse_args(argv)
    result = run(args)
    print(render(result))
    write_result(result, "rollout", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
