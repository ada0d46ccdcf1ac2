"""Planning at scale, no SSH: synthetic inventories of N GPU hosts through inventory load,
variable resolution, the compatibility check and file_sd generation; time and peak memory of each
stage, every size in its own process.

    .venv/bin/python -m bench.planning --sizes 1000,10000,100000

Writes ``bench/results/planning-<date>.json``.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.measure import table, write_result
from bench.tools import REPO

GPU_MODELS = (("H100", 8, True), ("H200", 8, True), ("A100", 4, False), ("B200", 8, True))
# Issue 20 item 5: planning 100,000 GPU hosts under 3 s and 500 MiB (round one: under 20 s).
TARGET_S = 3.0
TARGET_MIB = 500.0
HOSTS_PER_RACK = 32
GPU_ROLES = ("nvidia_driver", "dcgm", "dcgm_exporter", "node_exporter")


def host_name(i: int) -> str:
    return f"gpu{i:06d}"


def host_address(i: int) -> str:
    """A documentation-range-free private address per host (never contacted: no SSH here)."""
    return f"10.{(i >> 16) & 0xFF}.{(i >> 8) & 0xFF}.{i & 0xFF}"


LAYOUTS = ("racks", "flat")
# Both layouts: the connection settings on all, the versions planned for the fleet on gpu.
FLEET_HEADER = (
    "all:",
    "  vars:",
    "    ansible_user: root",
    "    gpumon_host_key_policy: verify",
    "  children:",
    "    gpu:",
    "      vars:",
    '        nvidia_driver_branch: "580"',
    "        dcgm_version: 4.4.2",
    "        dcgm_exporter_version: 4.4.2-4.7.1",
    "        cluster: synth",
)
# Both layouts: a Prometheus HA pair and three Alertmanager peers.
MONITORING_GROUPS = (
    "    monitoring:",
    "      children:",
    "        prometheus:",
    "          hosts:",
    "            prom01: {ansible_host: 10.255.0.1}",
    "            prom02: {ansible_host: 10.255.0.2}",
    "        alertmanager:",
    "          hosts:",
    "            prom01: {}",
    "            prom02: {}",
    "            mon01: {ansible_host: 10.255.0.3}",
)


def sharded_groups(shards: int) -> tuple[str, ...]:
    """The monitoring groups of a tier of ``shards`` HA pairs (``replica_name``), each replica
    setting its ``prometheus_shard``, and three Alertmanager peers."""
    replicas = [
        f"            {replica_name(s, r)}: {{ansible_host: 10.254.{s >> 7}.{(s & 127) * 2 + r}, "
        f"prometheus_shard: {shard_name(s)}}}"
        for s in range(shards)
        for r in range(2)
    ]
    return (
        "    monitoring:",
        "      children:",
        "        prometheus:",
        "          hosts:",
        *replicas,
        "        alertmanager:",
        "          hosts:",
        *(f"            mon{i:02d}: {{ansible_host: 10.255.0.{i}}}" for i in (1, 2, 3)),
    )


def shard_name(s: int) -> str:
    return f"s{s:03d}"


def replica_name(s: int, r: int) -> str:
    return f"prom-{shard_name(s)}{'ab'[r]}"


def inventory_yaml(n: int, layout: str = "racks", shards: int = 0) -> str:
    """An Ansible YAML inventory: racks of 32 GPU hosts with their own vars, the versions planned
    for the whole fleet on ``gpu``, a Prometheus HA pair and three Alertmanager peers. ``flat``:
    every GPU host listed in ``gpu`` itself, its rack a host variable (as a generated inventory
    or one INI ``[gpu]`` section has them). ``shards``: that many pairs instead of one."""
    if layout == "flat":
        return _flat_yaml(n)
    monitoring = sharded_groups(shards) if shards else MONITORING_GROUPS
    out = [
        *FLEET_HEADER,
        "      children:",
    ]
    racks = (n + HOSTS_PER_RACK - 1) // HOSTS_PER_RACK
    for r in range(racks):
        model, count, nvswitch = GPU_MODELS[r % len(GPU_MODELS)]
        out += [
            f"        rack{r:05d}:",
            "          vars:",
            f"            rack: r{r:05d}",
            f"            gpu_model: {model}",
            f"            gpu_count: {count}",
            f"            nvswitch: {'true' if nvswitch else 'false'}",
            f"            slurm_partition: {'train' if r % 3 else 'infer'}",
            f"            scrape_tier: {'training' if r % 3 else 'inference'}",
            "          hosts:",
        ]
        for i in range(r * HOSTS_PER_RACK, min(n, (r + 1) * HOSTS_PER_RACK)):
            out.append(f"            {host_name(i)}: {{ansible_host: {host_address(i)}}}")
    return "\n".join([*out, *monitoring]) + "\n"


def _flat_yaml(n: int) -> str:
    out = [
        *FLEET_HEADER,
        "        gpu_model: H100",
        "        gpu_count: 8",
        "        nvswitch: true",
        "        scrape_tier: training",
        "      hosts:",
    ]
    for i in range(n):
        rack = f"r{i // HOSTS_PER_RACK:05d}"
        out.append(f"        {host_name(i)}: {{ansible_host: {host_address(i)}, rack: {rack}}}")
    return "\n".join([*out, *MONITORING_GROUPS]) + "\n"


def inventory_path(n: int, workdir: Path, layout: str, shards: int = 0) -> Path:
    """The inventory of ``n`` hosts in ``layout`` (``shards`` pairs), written once per work
    directory."""
    name = f"inventory-{n}" if layout == "racks" else f"inventory-{layout}-{n}"
    path = workdir / (f"{name}-{shards}-shards.yml" if shards else f"{name}.yml")
    if not path.exists():
        path.write_text(inventory_yaml(n, layout, shards))
    return path


def targets_in(text: str) -> int:
    """How many target groups a targets file holds (file_sd.render: one group per line)."""
    return max(text.count("\n") - 2, 0)


def _rss_mib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB."""
    now = peak = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return now, peak


def measure_one(n: int, workdir: Path, layout: str = "racks") -> dict[str, Any]:
    """Every stage for ``n`` hosts, in this process (run by ``--one``)."""
    stages: dict[str, dict[str, float]] = {}
    start_rss, _ = _rss_mib()

    def start() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def stage(name: str, started: tuple[float, float]) -> None:
        # CPU seconds beside wall: on a shared machine the wall time includes waiting for a core.
        wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
        now, peak = _rss_mib()
        stages[name] = {
            "s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "rss_mib": round(now, 1),
            "peak_rss_mib": round(peak, 1),
        }

    path = inventory_path(n, workdir, layout)

    t = start()
    from deployer import memory
    from deployer.gpu import preflight, rules
    from deployer.inventory import load_inventory
    from deployer.monitoring import file_sd
    from deployer.plan import Planner, resolve_view
    from deployer.roles import Play

    stage("import", t)
    t = start()
    inventory = load_inventory(path, keep=True)  # as DeploySession.load loads it
    stage("inventory_load", t)

    from deployer.session import validation_facts

    planner = Planner(inventory, [REPO / "roles"], REPO / "templates")
    # As ``gpumon-deploy check --offline`` plans: facts are the pre-connection stand-in.
    context = {"facts": validation_facts("prom01").to_json()}
    gpu_play = Play(name="gpu", hosts="gpu", roles=GPU_ROLES)
    hosts = list(inventory.hosts)
    # As DeploySession.preflight judges: the variables and the plans of every GPU host under one
    # pause of the cyclic collector, freed before it comes back.
    with memory.collector_paused():
        t = start()
        defaults = planner.play_defaults(gpu_play)
        # As the preflight reads them (Planner.variables): views over the layers, nothing copied.
        variables = {h: resolve_view(inventory, h, defaults) for h in hosts}
        stage("variable_resolution", t)

        t = start()
        gpu = preflight.gpu_hosts(inventory, hosts)
        plans = preflight.host_plans(inventory, gpu, variables, None)
        refused = rules.check(plans)
        del variables, plans
        stage("compatibility_check", t)

    t = start()
    prom_play = Play(name="prometheus", hosts="prometheus", roles=("prometheus",))
    prom_vars = planner.host_vars("prom01", prom_play, context)
    # As the prometheus role writes them (its file_sd.json.j2 calls targets_file): one job's
    # target groups at a time, each file's text kept.
    rendered = {job: file_sd.targets_file(prom_vars, job) for job in file_sd.JOBS}
    stage("file_sd_generation", t)

    # The replicas' remote_write section: queue sized from every target (deployer/monitoring/remote_write.py).
    t = start()
    from deployer.monitoring import remote_write

    queue = remote_write.queue_config(prom_vars, remote_write.samples_per_second(prom_vars))
    stage("remote_write_sizing", t)

    _, peak = _rss_mib()
    return {
        "hosts": len(hosts),
        "layout": layout,
        "gpu_hosts": len(gpu),
        "refusals": len(refused),
        "file_sd_targets": {job: targets_in(text) for job, text in rendered.items()},
        "file_sd_bytes": sum(len(t) for t in rendered.values()),
        "remote_write_queue": queue,
        "inventory_bytes": path.stat().st_size,
        "stages": stages,
        "total_s": round(sum(s["s"] for s in stages.values() if s is not stages["import"]), 3),
        "total_cpu_s": round(
            sum(s["cpu_s"] for s in stages.values() if s is not stages["import"]), 3
        ),
        "peak_rss_mib": round(peak, 1),
        "rss_at_start_mib": round(start_rss, 1),
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def _session(path: Path) -> Any:
    """The inventory loaded as ``gpumon-deploy capacity`` loads it (no host planned)."""
    from deployer.session import DeploySession, RunOptions

    return DeploySession.load(RunOptions(inventory=path), plan=False)


def recommend_shards(n: int, workdir: Path) -> dict[str, Any]:
    """What ``gpumon-deploy capacity`` recommends for ``n`` GPU hosts under one pair (untimed:
    the measured run is the sharded tier it recommends)."""
    from deployer.monitoring import capacity_plan

    result = capacity_plan.of_session(_session(inventory_path(n, workdir, "racks")))
    return {
        "recommended_shards": result.recommended_shards,
        "series_per_replica_unsharded": result.per_replica.series,
        "samples_per_s_unsharded": result.per_replica.samples_per_s,
        "why": result.why,
    }


def measure_capacity_shards(n: int, workdir: Path, k: int) -> dict[str, Any]:
    """``n`` GPU hosts and ``k`` HA pairs (the shards the capacity computation recommends), in
    this process: the inventory loaded, the capacity of the sharded tier computed as ``gpumon-deploy
    capacity`` computes it (every GPU host's exporter planned from its variables, the tier sized
    whole and per shard), then every replica planned as ``up`` plans it (its own variables) and
    its dcgm and node targets files rendered, as the prometheus role renders them
    (``--capacity-shards N``)."""
    from deployer.monitoring import capacity_plan, file_sd, shards
    from deployer.roles import Play
    from deployer.session import validation_facts

    path = inventory_path(n, workdir, "racks", k)
    stages: dict[str, dict[str, float]] = {}
    clock = [time.perf_counter(), time.process_time()]

    def stage(name: str) -> None:
        # CPU seconds beside wall: on a shared machine the wall time includes waiting for a core
        wall, cpu = time.perf_counter(), time.process_time()
        stages[name] = {
            "s": round(wall - clock[0], 3),
            "cpu_s": round(cpu - clock[1], 3),
            "peak_rss_mib": _rss_mib()[1],
        }
        clock[:] = [time.perf_counter(), time.process_time()]

    session = _session(path)  # the inventory, kept for the run (memory.keep_for_the_run)
    stage("inventory_load")
    result = capacity_plan.of_session(session)
    stage("capacity")
    planner = session.load_content()
    play = Play(name="prometheus", hosts="prometheus", roles=("prometheus",))
    replicas = [replica_name(s, r) for s in range(k) for r in range(2)]
    sizes, per_shard = [], []
    for r in replicas:
        v = planner.host_vars(r, play, {"facts": validation_facts(r).to_json()})
        sizes.append(sum(len(file_sd.targets_file(v, job)) for job in shards.SHARDED_JOBS))
        if r.endswith("a"):
            per_shard.append(len(file_sd.job_members(v, "dcgm")))
    stage("file_sd_every_replica")
    return {
        "hosts": n,
        "shards": k,
        "replicas": len(replicas),
        "series_per_replica_sharded": result.per_replica.series,
        "recommended_shards_sharded": result.recommended_shards,
        "gpu_hosts_per_shard_min_max": [min(per_shard), max(per_shard)],
        "file_sd_bytes_per_replica_max": max(sizes),
        "stages": stages,
        "total_s": round(sum(st["s"] for st in stages.values()), 3),
        "peak_rss_mib": round(_rss_mib()[1], 1),
    }


def capacity_verdict(r: dict[str, Any]) -> str:
    """Item 5's target on the planning the sharded tier adds (the inventory loaded, the
    capacity computed, every shard's targets files rendered): the stages this run timed."""
    parts = " + ".join(
        f"{name.replace('_', ' ')} {st['s']:.2f}" for name, st in r["stages"].items()
    )
    fast = "met" if r["total_s"] < TARGET_S else "MISSED"
    small = "met" if r["peak_rss_mib"] < TARGET_MIB else "MISSED"
    return (
        f"planning {r['hosts']:,} hosts with capacity and {r['shards']} shards' "
        f"({r['replicas']} replicas') file_sd: {parts} = {r['total_s']:.2f} s "
        f"(target < {TARGET_S:g} s: {fast}), peak "
        f"{r['peak_rss_mib']:.0f} MiB (target < {TARGET_MIB:g} MiB: {small}); the variable "
        "resolution and compatibility check of the plain run come on top"
    )


def run_sizes(
    sizes: list[int], workdir: Path, timeout_s: float, layout: str = "racks"
) -> list[dict[str, Any]]:
    results = []
    for n in sizes:
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.planning",
                    "--one",
                    str(n),
                    "--workdir",
                    str(workdir),
                    "--layout",
                    layout,
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            results.append(
                {"hosts": n, "layout": layout, "error": f"timed out after {timeout_s:.0f}s"}
            )
            print(f"  {n:>7} hosts: timed out", file=sys.stderr)
            continue
        if proc.returncode != 0:
            results.append({"hosts": n, "layout": layout, "error": proc.stderr.strip()[-800:]})
            print(f"  {n:>7} hosts: failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        got = json.loads(proc.stdout)
        got["wall_s"] = round(time.perf_counter() - started, 3)
        results.append(got)
        print(
            f"  {n:>7} hosts: {got['total_s']:.2f}s, peak {got['peak_rss_mib']:.0f} MiB",
            file=sys.stderr,
        )
    return results


def render(results: list[dict[str, Any]]) -> str:
    names = [
        "inventory_load",
        "variable_resolution",
        "compatibility_check",
        "file_sd_generation",
        "remote_write_sizing",
    ]
    rows = [
        [
            "hosts",
            *[n.replace("_", " ") + " s" for n in names],
            "total s",
            "total CPU s",
            "peak RSS MiB",
            "KiB/host",
        ]
    ]
    ok = [r for r in results if "stages" in r]
    for r in ok:
        base = ok[0]
        per_host = (
            (r["peak_rss_mib"] - base["peak_rss_mib"]) * 1024 / (r["hosts"] - base["hosts"])
            if r is not base
            else float("nan")
        )
        rows.append(
            [
                str(r["hosts"]),
                *[f"{r['stages'][n]['s']:.2f}" for n in names],
                f"{r['total_s']:.2f}",
                f"{r['total_cpu_s']:.2f}",
                f"{r['peak_rss_mib']:.0f}",
                "-" if r is base else f"{per_host:.1f}",
            ]
        )
    for r in results:
        if "error" in r:
            rows.append([str(r["hosts"]), "ERROR", *[""] * (len(rows[0]) - 2)])
    return "\n".join([table(rows), *verdicts(results)])


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    """The issue's targets for planning (time and peak memory), judged on the 100,000-host size
    when this run has it."""
    lines = []
    for r in results:
        if r["hosts"] >= 100_000:
            shape = "" if r.get("layout", "racks") == "racks" else f" ({r['layout']})"
            if "stages" not in r:
                lines.append(
                    f"planning {r['hosts']:,} hosts{shape}: failed "
                    f"(target < {TARGET_S:g} s and < {TARGET_MIB:g} MiB)"
                )
                continue
            fast = "met" if r["total_s"] < TARGET_S else "MISSED"
            small = "met" if r["peak_rss_mib"] < TARGET_MIB else "MISSED"
            lines.append(
                f"planning {r['hosts']:,} hosts{shape}: {r['total_s']:.2f} s "
                f"(target < {TARGET_S:g} s: {fast}), peak {r['peak_rss_mib']:.0f} MiB "
                f"(target < {TARGET_MIB:g} MiB: {small})"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.planning", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--workdir", default="/var/cache/gpumon-bench/planning")
    parser.add_argument("--timeout", type=float, default=300.0, help="per size, seconds")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--layout", choices=LAYOUTS, default="racks",
                        help="racks of 32 (default) or one flat gpu group")  # fmt: skip
    parser.add_argument("--out", default=None)
    parser.add_argument("--capacity-shards", type=int, default=None, metavar="HOSTS",
                        help="capacity and every shard's file_sd for HOSTS GPU hosts")  # fmt: skip
    parser.add_argument("--shards", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    from deployer.monitoring import handoff

    # Planned as a new tier, in every size's process: the re-shard record of a tier this machine
    # converged (~/.local/state/gpumon-deploy/shards/) would otherwise be read as the layout the
    # replicas hand over from, and from one pair every replica of that pair takes every host.
    if args.one is None and args.shards is None:  # a measured process inherits its parent's
        records = tempfile.mkdtemp(prefix="bench-planning-records-")
        atexit.register(shutil.rmtree, records, True)
        os.environ[handoff.RECORD_DIR_ENV] = records
    if args.capacity_shards is not None and args.shards is not None:  # the measured process
        print(json.dumps(measure_capacity_shards(args.capacity_shards, workdir, args.shards)))
        return 0
    if args.capacity_shards is not None:
        got = recommend_shards(args.capacity_shards, workdir)
        print(f"  {got['why']}: {got['recommended_shards']} shards", file=sys.stderr)
        # Twice, each a process of its own: the first plans as on a new controller, the second
        # as every run after it, with the assignment the first remembered
        # (deployer/monitoring/shard_memo.py, in this run's record directory).
        runs = []
        for _ in ("first", "next"):
            proc = subprocess.run(
                [sys.executable, "-m", "bench.planning", "--capacity-shards",
                 str(args.capacity_shards), "--shards", str(got["recommended_shards"]),
                 "--workdir", str(workdir)],
                cwd=REPO, capture_output=True, text=True, timeout=args.timeout, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                print(proc.stderr.strip()[-2000:], file=sys.stderr)
                return 1
            runs.append(json.loads(proc.stdout))
        got.update(runs[0])
        got["next_run"] = runs[1]
        print(json.dumps(got, indent=1))
        print("first run: " + capacity_verdict(got), file=sys.stderr)
        print("next run, the assignment remembered: " + capacity_verdict(runs[1]), file=sys.stderr)
        return 0
    if args.one is not None:
        print(json.dumps(measure_one(args.one, workdir, args.layout)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results = run_sizes(sizes, workdir, args.timeout, args.layout)
    print(render(results))
    write_result(
        {
            "benchmark": "planning",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join([".venv/bin/python -m bench.planning", *sys.argv[1:]]),
            "results": results,
        },
        "planning",
        args.out,
    )
    return 0 if all("stages" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
