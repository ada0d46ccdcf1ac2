"""Converge speed on the lab, side by side: gpumon-deploy, ansible-core, pyinfra and the raw floor
running the same 10-step node_exporter role, no-op and cold, interleaved, medians and ratios.

    .venv/bin/gpumon-deploy lab up --name bench --gpu-nodes 0
    .venv/bin/python -m bench.converge --lab bench --runs 5
    .venv/bin/gpumon-deploy lab down --name bench

Prints a table and the ratios and writes ``bench/results/converge-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

from bench.measure import Sample, Summary, ratio, rotated, summarise, summary_table, write_result
from bench.tools import Fleet, Prepared, Target, available, node_exporter_workload

TOOLS = ("gpumon", "ansible", "mitogen", "pyinfra", "floor")
TARGETS = {
    "ansible": 10.0,  # no-op at least 10x faster than ansible-core
    "mitogen": 12.0,  # no-op at least 12x faster than Ansible with Mitogen (issue 20)
    "pyinfra": 2.0,  # at least 2x faster than pyinfra
    "floor": 1 / 1.15,  # within 1.15x of the raw floor (floor / gpumon >= 0.87; issue 20)
}
# Cold runs (issue 20): at least 2.5x faster than Ansible with Mitogen, 2x than pyinfra.
TARGETS_COLD = {"mitogen": 2.5, "pyinfra": 2.0}


def lab_fleet(name: str, only: str = "") -> tuple[Fleet, str]:
    """The hosts of lab ``name`` (those named in the comma-separated ``only``, when given) and
    the armored key of its mirror."""
    from deployer.lab import mirror
    from deployer.lab.lab import Lab

    lab = Lab(name)
    if not lab.hosts:
        raise SystemExit(f"lab {name!r} is not up: .venv/bin/gpumon-deploy lab up --name {name}")
    fleet = Fleet(
        hosts=tuple(
            Target(h.name, h.address) for h in lab.hosts if not only or h.name in only.split(",")
        ),
        private_key=lab.private_key_path,
        known_hosts=lab.known_hosts_path,
        vars={"apt_mirror_url": lab.mirror_vars()["apt_mirror_url"]},
    )
    return fleet, mirror.public_key().decode()


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_at_start": os.getloadavg(),
    }


def tool_versions() -> dict[str, str]:
    import subprocess

    from bench.tools import GPUMON, PEERS_VENV

    out = {}
    for tool, argv in {
        "gpumon": [str(GPUMON), "--version"],
        "ansible": [str(PEERS_VENV / "bin" / "ansible"), "--version"],
        "mitogen": [
            str(PEERS_VENV / "bin" / "python"),
            "-c",
            "import mitogen; print('mitogen', '.'.join(map(str, mitogen.__version__)))",
        ],
        "pyinfra": [str(PEERS_VENV / "bin" / "pyinfra"), "--version"],
    }.items():
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            out[tool] = (proc.stdout.strip().splitlines() or ["?"])[0]
        except OSError:
            out[tool] = "not installed"
    return out


def ratios(summaries: list[Summary], scenario: str) -> dict[str, float | None]:
    """How many times faster gpumon-deploy is than each other tool (median wall times);
    for the floor, floor/gpumon (1.0 = as fast as the floor, 0.5 = twice as slow)."""
    by_tool = {s.tool: s.wall_s for s in summaries if s.scenario == scenario}
    g = by_tool.get("gpumon")
    peers = ("ansible", "mitogen", "pyinfra", "floor")
    return {t: ratio(by_tool.get(t), g) for t in peers if t in by_tool}


def run(args: argparse.Namespace) -> dict[str, Any]:
    fleet, key = lab_fleet(args.lab, args.hosts)
    host_machine = machine()
    tools = available([t for t in args.tools.split(",") if t])
    missing = sorted(set(args.tools.split(",")) - set(tools))
    if missing:
        print(
            f"not installed, skipped: {', '.join(missing)} (pip install -e '.[bench]' into "
            "$GPUMON_BENCH_VENV, see bench/README.md)",
            file=sys.stderr,
        )
    work = Path(args.workdir) / f"converge-{os.getpid()}"
    prepared = Prepared(fleet, node_exporter_workload(key), work)
    samples: list[Sample] = []

    def record(s: Sample) -> None:
        samples.append(s)
        flag = "" if s.rc == 0 else f"  FAILED rc={s.rc}: {s.note}"
        print(
            f"  {s.scenario:<5} {s.tool:<8} {s.wall_s:7.3f}s  cpu {s.cpu_s:6.2f}s"
            f"  rss {s.peak_rss_mib:6.1f}MiB  changed={s.changed}{flag}",
            file=sys.stderr,
        )

    try:
        print(f"preparing {len(fleet.hosts)} hosts of lab {args.lab!r}", file=sys.stderr)
        prepared.prepare()
        # Warm-up: each tool converges once, so each one's state (its own apt source file)
        # is present before the no-op runs.
        for tool in (t for t in tools if t != "floor"):
            record(prepared.run(tool, "warm"))
        for n in range(args.runs):
            for tool in rotated(tools, n):
                record(prepared.run(tool, "noop"))
        cold_tools = [t for t in tools if t != "floor"]
        for n in range(args.cold_runs):
            for tool in rotated(cold_tools, n):
                prepared.reset()
                record(prepared.run(tool, "cold"))
    finally:
        prepared.close()

    measured = [s for s in samples if s.scenario != "warm"]
    summaries = summarise(measured)
    wrong = [
        s
        for s in measured
        if s.rc != 0
        or (s.scenario == "noop" and s.changed != 0)
        or (s.scenario == "cold" and not s.changed)
    ]
    return {
        "benchmark": "converge",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python -m bench.converge", *sys.argv[1:]]),
        "lab": args.lab,
        "hosts": [t.name for t in fleet.hosts],
        "machine": host_machine,
        "versions": tool_versions(),
        "runs": {"noop": args.runs, "cold": args.cold_runs},
        "summaries": [s.to_json() for s in summaries],
        "ratios": {"noop": ratios(summaries, "noop"), "cold": ratios(summaries, "cold")},
        "targets_noop": TARGETS,
        "targets_cold": TARGETS_COLD,
        "suspect_runs": [s.to_json() for s in wrong],
        "samples": [s.to_json() for s in samples],
    }


def render(result: dict[str, Any]) -> str:
    lines = [summary_table(result["summaries"]), ""]
    for scenario in ("noop", "cold"):
        for tool, r in result["ratios"][scenario].items():
            if r is None:
                continue
            if tool == "floor":
                lines.append(
                    f"{scenario}: gpumon-deploy takes {1 / r:.2f}x the raw floor's time"
                    f" (target <= {1 / TARGETS['floor']:.2f}x:"
                    f" {'met' if r >= TARGETS['floor'] else 'MISSED'})"
                    if scenario == "noop"
                    else ""
                )
            else:
                target = TARGETS[tool] if scenario == "noop" else TARGETS_COLD.get(tool)
                verdict = (
                    f" (target >= {target:g}x: {'met' if r >= target else 'MISSED'})"
                    if target
                    else ""
                )
                lines.append(f"{scenario}: gpumon-deploy is {r:.1f}x faster than {tool}{verdict}")
    if result["suspect_runs"]:
        lines.append(f"WARNING: {len(result['suspect_runs'])} runs failed or changed unexpectedly")
    return "\n".join(line for line in lines if line is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.converge", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--lab", default="bench", help="lab name (default: bench)")
    parser.add_argument(
        "--hosts",
        default="",
        help="the lab's hosts to run on, comma-separated (default: all; prom01,prom02,mon01 "
        "on a lab with GPU hosts is the 3-host lab)",
    )
    parser.add_argument("--runs", type=int, default=5, help="no-op runs per tool (default 5)")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold runs per tool (default 5)")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset")
    parser.add_argument("--workdir", default="/var/cache/gpumon-bench", help="scratch directory")
    parser.add_argument(
        "--out", default=None, help="result JSON (default bench/results/converge-DATE.json)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.cold_runs < 0:
        parser.error("--runs must be >= 1 and --cold-runs >= 0")
    result = run(args)
    print(render(result))
    write_result(result, "converge", args.out)
    return 1 if result["suspect_runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
