"""How cost grows with hosts: the file/template-only role on 1, 10, 50, 200 and 1,000
lightweight hosts (network namespaces running only sshd; deployer/lab/light.py), for
gpumon-deploy and the peers. Wall time, controller CPU seconds and peak RSS; no-op medians,
interleaved, plus one cold run.

    .venv/bin/python -m bench.scale --sizes 1,10,50,200,1000 --runs 3

The fleet is brought up for the run and torn down afterwards (namespaces, sshd, veths, bridge).
Writes ``bench/results/scale-<date>.json`` (again after every size, so a run cut short keeps
what it measured) and ``scale-<date>.svg``: each tool's no-op wall time, controller CPU and
peak RSS against the host count (bench/plot.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from bench.converge import machine, tool_versions
from bench.measure import Sample, summarise, summary_table, write_result
from bench.plot import chart
from bench.tools import Fleet, Prepared, Target, available, files_workload

# The targets for the scale runs (gpumon-deploy, no-op).
TARGET_200_HOSTS_S = 10.0  # 200 hosts no-op under 10 s on the 2-core machine
TARGET_PER_HOST_MIB = 1.0  # controller memory growing under 1 MB per host
# Issue 20: 1,000 hosts no-op under 30 s, controller memory under 200 MiB above its 1-host figure.
TARGET_1000_HOSTS_S = 30.0
TARGET_1000_ABOVE_1_MIB = 200.0

# Peers beyond these sizes take minutes per run on a 2-core machine (the hosts' side runs on the
# same cores): the defaults stop them there and the result says so.
PEER_MAX_HOSTS = {"ansible": 10, "mitogen": 50, "pyinfra": 200, "gpumon": 1000, "floor": 1000}
# Issue 20: at 3 (bench.converge) and 200 hosts, no-op >= 12x and cold >= 2.5x faster than
# Ansible with Mitogen, cold >= 2x faster than pyinfra.
TARGET_RATIOS_200 = {("noop", "mitogen"): 12.0, ("cold", "mitogen"): 2.5, ("cold", "pyinfra"): 2.0}


def fleet_of(light: Any, n: int) -> Fleet:
    hosts = light.hosts()[:n]
    return Fleet(
        hosts=tuple(Target(h.name, h.address, vars={"bench_root": str(h.root)}) for h in hosts),
        private_key=light.private_key_path,
        known_hosts=light.known_hosts_path,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from deployer.lab.light import LightFleet

    sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    tools = available([t for t in args.tools.split(",") if t])
    limits = dict(PEER_MAX_HOSTS)
    limits["ansible"] = args.ansible_max
    limits["mitogen"] = args.mitogen_max
    limits["pyinfra"] = args.pyinfra_max
    light = LightFleet(args.fleet, args.subnet)
    host_machine = machine()
    samples: list[Sample] = []
    skipped: dict[str, list[int]] = {}
    try:
        print(f"bringing up {max(sizes)} lightweight hosts", file=sys.stderr)
        # Ready within 60 s for 200 hosts; 1,000 took 84 s under load (32 s to start them).
        up = light.up(max(sizes), ready_timeout=max(60.0, 0.3 * max(sizes)))
        print(f"  ready in {up['ready']:.1f}s", file=sys.stderr)
        for n in sizes:
            fleet = fleet_of(light, n)
            prepared = Prepared(fleet, files_workload(), Path(args.workdir) / f"scale-{n}")
            todo = [t for t in tools if n <= limits.get(t, 1000)]
            skipped.update({t: [*skipped.get(t, []), n] for t in tools if t not in todo})
            try:
                for tool in (t for t in todo if t != "floor"):
                    prepared.reset()
                    s = prepared.run(tool, f"cold@{n}")
                    samples.append(s)
                    _show(s)
                for r in range(args.runs):
                    for tool in todo[r % len(todo) :] + todo[: r % len(todo)]:
                        s = prepared.run(tool, f"noop@{n}")
                        samples.append(s)
                        _show(s)
            finally:
                prepared.reset()
                prepared.close()
            if args.out is None:  # what is measured so far, kept should a later size be cut
                write_result(_result(args, sizes, host_machine, samples, skipped), "scale", None)
    finally:
        light.down()
    return _result(args, sizes, host_machine, samples, skipped)


def _result(
    args: argparse.Namespace,
    sizes: list[int],
    host_machine: dict[str, Any],
    samples: list[Sample],
    skipped: dict[str, list[int]],
) -> dict[str, Any]:
    summaries = summarise(samples)
    return {
        "benchmark": "scale",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python -m bench.scale", *sys.argv[1:]]),
        "machine": host_machine,
        "versions": tool_versions(),
        "sizes": sizes,
        "peer_sizes_skipped": skipped,
        "summaries": [s.to_json() for s in summaries],
        "suspect_runs": [
            s.to_json()
            for s in samples
            if s.rc != 0
            or (s.scenario.startswith("noop") and s.changed != 0)
            or (s.scenario.startswith("cold") and not s.changed)
        ],
        "samples": [s.to_json() for s in samples],
    }


def merge(result: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """``result`` with ``earlier``'s samples of the (tool, scenario) pairs it lacks, summarised
    again; ``merged_from`` names the earlier run."""
    have = {(s["tool"], s["scenario"]) for s in result["samples"]}
    extra = [s for s in earlier["samples"] if (s["tool"], s["scenario"]) not in have]
    samples = [Sample(**s) for s in result["samples"] + extra]
    out = dict(result)
    out["samples"] = [s.to_json() for s in samples]
    out["summaries"] = [s.to_json() for s in summarise(samples)]
    out["sizes"] = sorted({*result["sizes"], *earlier["sizes"]})
    out["suspect_runs"] = result["suspect_runs"] + [
        s for s in earlier["suspect_runs"] if (s["tool"], s["scenario"]) not in have
    ]
    out["merged_from"] = {"date": earlier["date"], "command": earlier["command"]}
    return out


def _show(s: Sample) -> None:
    flag = "" if s.rc == 0 else f"  FAILED: {s.note}"
    print(
        f"  {s.scenario:<9} {s.tool:<8} {s.wall_s:8.3f}s  cpu {s.cpu_s:7.2f}s"
        f"  rss {s.peak_rss_mib:7.1f}MiB  changed={s.changed}{flag}",
        file=sys.stderr,
    )


def growth(result: dict[str, Any], tool: str, field: str) -> float | None:
    """Per-host growth of ``field`` (median no-op) between the smallest and largest size run."""
    points = sorted(
        (int(s["scenario"].split("@")[1]), s[field])
        for s in result["summaries"]
        if s["tool"] == tool and s["scenario"].startswith("noop@")
    )
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return None
    (n0, v0), (n1, v1) = points[0], points[-1]
    return (v1 - v0) / (n1 - n0)


def noop_points(result: dict[str, Any], tool: str, field: str) -> list[tuple[float, float]]:
    """(hosts, median no-op ``field``) of ``tool``, by host count."""
    return sorted(
        (int(s["scenario"].split("@")[1]), s[field])
        for s in result["summaries"]
        if s["tool"] == tool and s["scenario"].startswith("noop@")
    )


def plot(result: dict[str, Any]) -> str:
    """The SVG of each tool's no-op cost against the host count (the README shows it)."""
    tools = [t for t in ("gpumon", "mitogen", "ansible", "pyinfra", "floor")]
    panels = []
    for title, unit, field, who in (
        ("no-op wall time", "s", "median_wall_s", tools),
        ("controller CPU", "CPU s", "median_cpu_s", tools),
        ("peak RSS", "MiB", "median_peak_rss_mib", [t for t in tools if t != "floor"]),
    ):
        series = {t: noop_points(result, t, field) for t in who}
        panels.append((title, unit, {t: p for t, p in series.items() if p}))
    return chart(panels, f"bench.scale {result['date']}, medians of no-op runs; {LOAD_NOTE}")


LOAD_NOTE = "log-log; the hosts' sshd share the controller's 2 cores"


def verdicts(result: dict[str, Any]) -> list[str]:
    """The targets this run can judge, each as one line saying met or missed."""
    lines = []
    at_1000 = {s["tool"]: s for s in result["summaries"] if s["scenario"] == "noop@1000"}
    if "gpumon" in at_1000:
        wall = at_1000["gpumon"]["median_wall_s"]
        met = "met" if wall < TARGET_1000_HOSTS_S else "MISSED"
        lines.append(
            f"1000 hosts no-op: {wall:.2f} s (target < {TARGET_1000_HOSTS_S:.0f} s: {met})"
        )
        one = noop_points(result, "gpumon", "median_peak_rss_mib")
        if one and one[0][0] == 1:
            above = at_1000["gpumon"]["median_peak_rss_mib"] - one[0][1]
            met = "met" if above < TARGET_1000_ABOVE_1_MIB else "MISSED"
            lines.append(
                f"1000 hosts controller memory: +{above:.0f} MiB above 1 host "
                f"(target < {TARGET_1000_ABOVE_1_MIB:.0f} MiB: {met})"
            )
    at_200 = [
        s for s in result["summaries"] if s["tool"] == "gpumon" and s["scenario"] == "noop@200"
    ]
    if at_200:
        wall = at_200[0]["median_wall_s"]
        met = "met" if wall < TARGET_200_HOSTS_S else "MISSED"
        lines.append(f"200 hosts no-op: {wall:.2f} s (target < {TARGET_200_HOSTS_S:.0f} s: {met})")
    for (scenario, peer), target in TARGET_RATIOS_200.items():
        walls = {
            s["tool"]: s["median_wall_s"]
            for s in result["summaries"]
            if s["scenario"] == f"{scenario}@200" and s["tool"] in ("gpumon", peer)
        }
        if len(walls) == 2 and walls["gpumon"] > 0:
            r = walls[peer] / walls["gpumon"]
            met = "met" if r >= target else "MISSED"
            lines.append(
                f"200 hosts {scenario}: {r:.1f}x faster than {peer} (target >= {target:g}x: {met})"
            )
    per_host = growth(result, "gpumon", "median_peak_rss_mib")
    if per_host is not None:
        met = "met" if per_host < TARGET_PER_HOST_MIB else "MISSED"
        lines.append(
            f"controller memory: +{per_host * 1024:.0f} KiB per host "
            f"(target < {TARGET_PER_HOST_MIB * 1024:.0f} KiB: {met})"
        )
    return lines


def render(result: dict[str, Any]) -> str:
    lines = [summary_table(result["summaries"]), ""]
    for tool in ("gpumon", "ansible", "mitogen", "pyinfra"):
        per_host_mib = growth(result, tool, "median_peak_rss_mib")
        per_host_s = growth(result, tool, "median_wall_s")
        if per_host_mib is not None and per_host_s is not None:
            lines.append(
                f"{tool}: +{per_host_s * 1000:.1f} ms and +{per_host_mib * 1024:.0f} KiB peak RSS "
                "per host (no-op)"
            )
    lines += verdicts(result)
    for tool, sizes in result["peer_sizes_skipped"].items():
        lines.append(f"{tool}: not run at {', '.join(map(str, sizes))} hosts (too slow here)")
    if result["suspect_runs"]:
        lines.append(f"WARNING: {len(result['suspect_runs'])} runs failed or changed unexpectedly")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", default="1,10,50,200,1000")
    parser.add_argument("--runs", type=int, default=3, help="no-op runs per tool and size")
    parser.add_argument("--tools", default="gpumon,ansible,mitogen,pyinfra,floor")
    parser.add_argument("--ansible-max", type=int, default=PEER_MAX_HOSTS["ansible"])
    parser.add_argument("--mitogen-max", type=int, default=PEER_MAX_HOSTS["mitogen"])
    parser.add_argument("--pyinfra-max", type=int, default=PEER_MAX_HOSTS["pyinfra"])
    parser.add_argument("--fleet", default="bench", help="light fleet name")
    parser.add_argument(
        "--subnet", default="10.214.0.0/22", help="the light fleet's subnet (one per fleet)"
    )
    parser.add_argument("--workdir", default="/var/cache/gpumon-bench")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--merge",
        default=None,
        help="an earlier run's JSON: its samples of the (tool, size) pairs this run does not "
        "measure join this result (a run cut short, continued at the sizes it missed)",
    )
    args = parser.parse_args(argv)
    result = run(args)
    if args.merge:
        result = merge(result, json.loads(Path(args.merge).read_text()))
    print(render(result))
    path = write_result(result, "scale", args.out)
    svg = path.with_suffix(".svg")
    svg.write_text(plot(result))
    print(f"written {svg}")
    return 1 if result["suspect_runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
