"""The full GPU-host stack on the lab: ``gpumon-deploy up --limit gpu`` (site.yml's four GPU plays:
nvidia_driver, dcgm, dcgm_exporter, node_exporter) no-op and cold beside the raw floor, medians.

    .venv/bin/gpumon-deploy lab up --name gstack --gpu-nodes 4
    .venv/bin/python -m bench.gpustack --lab gstack --runs 5 --cold-runs 5
    .venv/bin/gpumon-deploy lab down --name gstack

This module owns the pieces only this bench needs: the floor script built from the engine's own
plan (the facts script plus every planned task's read script, in one shell per host), the cold
reset that returns a GPU host to its state before the first ``up``, and the host fingerprint that
proves each reset did. Timing, parsing and the table come from bench.measure, the SSH fan-out
from bench.tools.Prepared, the machine description from bench.converge.

Prints a table and the floor ratio and writes ``bench/results/gpustack-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.converge import machine, tool_versions
from bench.measure import (
    Sample,
    gpumon_changed,
    ratio,
    rotated,
    run_measured,
    summarise,
    summary_table,
    write_result,
)
from bench.tools import BENCH_DIR, GPUMON, Fleet, Prepared, Target, Workload

TOOLS = ("gpumon", "floor")
LIMIT = "gpu"
# The lab's simulated NVIDIA repository lacks the matrix's default exporter (4.6.0-4.8.3); the
# same pin tests/integration/test_gpu_roles.py uses. The lab inventory already pins
# node_exporter_version to the 1.5.0 its release mirror holds.
LAB_EXTRA_VARS = ("dcgm_exporter_version=4.5.3-4.8.2",)

# ---------------------------------------------------------- what the GPU roles leave on a host
# From roles/{nvidia_driver,dcgm,dcgm_exporter,node_exporter} and the lab's simulated packages
# (deployer/lab/gpusim/catalog.py), checked against a host's fingerprint before and after `up`.

# Units the roles or the packages enable or start (stopped and disabled before the purge: the
# simulated packages' postrm does not remove enablement links, nor the `dcgm` alias).
GPU_UNITS = (
    "dcgm-exporter.service",
    "nvidia-dcgm-exporter.service",
    "nvidia-dcgm.service",
    "nvidia-fabricmanager.service",
    "nvidia-persistenced.service",
    "node_exporter.service",
    "gpusim-nvidia-module.service",
)
# Every package the driver, DCGM and exporter tasks install, whatever the branch and variant
# (driver, its libraries and tools, pinning package, fabric manager, NSCQ, DCGM core and
# -cuda<N>, the exporter). node_exporter is installed from the release archive, not a package.
GPU_PACKAGE_NAMES = (
    r"nvidia-[^ ]+|libnvidia-[^ ]+|libcuda1|cuda-drivers(-[^ ]+)?|datacenter-gpu-manager(-[^ ]+)?"
)
GPU_PACKAGES = re.compile(f"^({GPU_PACKAGE_NAMES})$")
# Files and directories the roles write (apt source, keyring and pins; nouveau blacklist; unit
# files, drop-ins and enablement links; configuration; release archive; check scripts;
# textfile collector) plus what the packages leave behind after a purge (DCGM's log directory).
GPU_PATHS = (
    "/etc/apt/sources.list.d/nvidia-cuda.sources",
    "/etc/apt/keyrings/nvidia-cuda.gpg",
    "/etc/apt/preferences.d/gpumon-nvidia-driver.pref",
    "/etc/apt/preferences.d/gpumon-dcgm.pref",
    "/etc/apt/preferences.d/gpumon-dcgm-exporter.pref",
    "/etc/modprobe.d/blacklist-nouveau.conf",
    "/etc/dcgm-exporter",
    "/etc/systemd/system/dcgm-exporter.service",
    "/etc/systemd/system/node_exporter.service",
    "/etc/systemd/system/dcgm.service",
    "/etc/systemd/system/nvidia-dcgm.service.d",
    "/etc/systemd/system/nvidia-persistenced.service.d",
    "/opt/node_exporter",
    "/usr/local/bin/node_exporter",
    "/usr/local/libexec/gpumon",
    "/var/lib/node_exporter",
    "/var/log/nvidia-dcgm",
)
# Directories that did not exist before and are left empty once GPU_PATHS are gone.
GPU_EMPTY_PARENTS = ("/usr/local/libexec",)
GPU_USERS = ("dcgm-exporter", "node-exporter", "nvidia-dcgm", "nvidia-persistenced")


def reset_script() -> str:
    """One shell script that returns a converged GPU host to its state before the first ``up``.

    Stops and disables the units, unholds and purges every GPU package and the packages they
    pulled in (``autoremove``), "unloads" the simulated kernel module (the lab's stand-in for
    ``rmmod nvidia``: its /proc/driver bind mount and /run/gpusim state), removes the roles'
    files, users and groups, empties apt's lists and package cache (the first ``up`` found
    none), and reloads systemd.
    """
    units = " ".join(GPU_UNITS)
    paths = " ".join(shlex.quote(p) for p in GPU_PATHS)
    wants = " ".join(f"/etc/systemd/system/multi-user.target.wants/{u}" for u in GPU_UNITS)
    steps = [
        "export DEBIAN_FRONTEND=noninteractive",
        f"systemctl disable --now {units} >/dev/null 2>&1",
        # the roles' node_exporter unit wants network-online.target, which stays active otherwise
        "systemctl stop network-online.target >/dev/null 2>&1",
        "pkgs=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' 2>/dev/null"
        f" | grep -E {shlex.quote(f'^({GPU_PACKAGE_NAMES}) ')} | cut -d' ' -f1)",
        'if [ -n "$pkgs" ]; then apt-mark unhold $pkgs >/dev/null'
        " && apt-get -y -q -o DPkg::Lock::Timeout=300 purge $pkgs >/dev/null"
        " || exit 20; fi",
        # and what they pulled in (libnuma1 with DCGM): else the next cold run finds it installed
        "apt-get -y -q -o DPkg::Lock::Timeout=300 autoremove --purge >/dev/null || exit 24",
        "if findmnt -n /proc/driver >/dev/null 2>&1; then umount /proc/driver || exit 21; fi",
        "rm -rf /run/gpusim",
        f"rm -rf {paths} {wants}",
        *(f"rmdir --ignore-fail-on-non-empty {d} 2>/dev/null" for d in GPU_EMPTY_PARENTS),
        *(
            f"if getent passwd {u} >/dev/null; then userdel {u} || exit 22; fi"
            f"; if getent group {u} >/dev/null; then groupdel {u} || exit 23; fi"
            for u in GPU_USERS
        ),
        "find /var/lib/apt/lists -mindepth 1 -maxdepth 1 ! -name partial ! -name lock"
        " -exec rm -rf {} +",
        "apt-get clean",
        "systemctl daemon-reload",
        "systemctl reset-failed >/dev/null 2>&1",
        "true",
    ]
    return "\n".join(steps)


# ---------------------------------------------------------------- the host fingerprint

FINGERPRINT_SECTIONS = ("packages", "holds", "users", "groups", "paths", "unit-files", "active")
FINGERPRINT_SCRIPT = "\n".join(
    [
        "echo @@packages; dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' | sort",
        "echo @@holds; apt-mark showhold | sort",
        "echo @@users; getent passwd | cut -d: -f1,3,6,7 | sort",
        "echo @@groups; getent group | cut -d: -f1,3 | sort",
        "echo @@paths; find /etc /usr/local /opt /home /usr/lib/systemd/system /var/lib/apt/lists"
        " /var/cache/apt /var/lib/node_exporter /var/log/nvidia-dcgm /run/gpusim /proc/driver"
        " -xdev -printf '%p %y %m %u %g\\n' 2>/dev/null | sort",
        "echo @@unit-files; systemctl list-unit-files --no-legend --no-pager | sort",
        "echo @@active; systemctl list-units --state=active --no-legend --no-pager --plain"
        " | awk '{print $1}' | sort",
        "true",
    ]
)
# apt's own bookkeeping, there after any apt run (locks, partial downloads, its aux files).
_APT_BOOKKEEPING = re.compile(r"^/var/(lib/apt/lists|cache/apt/archives)/(lock|partial|auxfiles) ")
# Active units that come and go on their own (timers' services, user sessions of our SSH).
_TRANSIENT_ACTIVE = re.compile(r"^(session-\S+\.scope|user@\S+|user-\S+\.slice|.*\.timer|apt-\S+)$")


def parse_fingerprint(text: str) -> dict[str, list[str]]:
    """Sections of FINGERPRINT_SCRIPT's output, each a sorted list of lines."""
    out: dict[str, list[str]] = {s: [] for s in FINGERPRINT_SECTIONS}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("@@") and line[2:] in out:
            current = line[2:]
        elif current is not None and line.strip():
            out[current].append(" ".join(line.split()))
    if current is None:
        raise ValueError("not a fingerprint: no @@ section markers")
    return {k: sorted(v) for k, v in out.items()}


def residue(baseline: Mapping[str, Sequence[str]], now: Mapping[str, Sequence[str]]) -> list[str]:
    """What differs between two fingerprints: ``+ section: line`` present only now, ``-``
    present only in the baseline. Empty when the host is back to its baseline."""
    diff = []
    for section in FINGERPRINT_SECTIONS:
        before, after = set(baseline.get(section, ())), set(now.get(section, ()))
        if section == "paths":
            before = {p for p in before if not _APT_BOOKKEEPING.match(p)}
            after = {p for p in after if not _APT_BOOKKEEPING.match(p)}
        if section == "active":
            before = {u for u in before if not _TRANSIENT_ACTIVE.match(u)}
            after = {u for u in after if not _TRANSIENT_ACTIVE.match(u)}
        diff += [f"+ {section}: {line}" for line in sorted(after - before)]
        diff += [f"- {section}: {line}" for line in sorted(before - after)]
    return diff


# ---------------------------------------------------------------- the floor, from the plan


def floor_script(facts_script: str, read_scripts: Sequence[str]) -> str:
    """The checks gpumon-deploy runs on one host, in one shell: the facts script, then every
    planned task's read script wrapped as the executor's batch_read wraps it (a subshell,
    stderr dropped, its exit status printed after a marker). It checks; it fixes nothing."""
    parts = [f"( {facts_script.strip()}\n) 2>/dev/null; printf '\\n@@facts %d@@\\n' $?"]
    parts += [
        f"( {script}\n) 2>/dev/null; printf '\\n@@read {i} %d@@\\n' $?"
        for i, script in enumerate(read_scripts)
    ]
    parts.append("true")
    return "\n".join(parts)


_FLOOR_MARK = re.compile(r"^@@(facts|read \d+) (\d+)@@$", re.M)


def floor_statuses(stdout: str) -> dict[str, int]:
    """Exit status of each part of a floor script's run, by part (``facts``, ``read 0``, ...):
    proof that the floor ran every check to its end."""
    return {m.group(1): int(m.group(2)) for m in _FLOOR_MARK.finditer(stdout)}


def planned_reads(inventory: Path, extra_vars: Sequence[str]) -> dict[str, list[str]]:
    """Each selected GPU host's read scripts, in the order ``up`` reads them: the session loads
    and plans as ``up`` does, gathers the hosts' facts, plans again from them (as ``up``
    does before converging) and takes every module task of every play (not handlers, not
    flush points: a no-op runs neither)."""
    from deployer.session import DeploySession, RunOptions

    session = DeploySession.load(
        RunOptions(inventory=inventory, limit=LIMIT, extra_vars=list(extra_vars))
    )
    try:
        session.gather_facts([p.host for p in session.plans])
        if session.unreachable:
            raise RuntimeError(f"unreachable while planning the floor: {session.unreachable}")
        session.build_plan(session.facts)
    finally:
        session.pool.close_all()
    return {
        plan.host: [
            t.module.read_script(t.args)
            for hp in plan.plays
            for t in hp.tasks
            if t.module is not None
        ]
        for plan in session.plans
    }


# ---------------------------------------------------------------- the lab and the runs


def gpu_fleet(name: str) -> tuple[Fleet, Path]:
    """Lab ``name``'s GPU hosts and the lab's own inventory (groups, GPU models, mirror URLs)."""
    from deployer.lab.lab import Lab

    lab = Lab(name)
    gpu = [h for h in lab.hosts if h.is_gpu]
    if not gpu:
        raise SystemExit(
            f"lab {name!r} is not up or has no GPU hosts:"
            f" .venv/bin/gpumon-deploy lab up --name {name} --gpu-nodes 4"
        )
    fleet = Fleet(
        hosts=tuple(Target(h.name, h.address) for h in gpu),
        private_key=lab.private_key_path,
        known_hosts=lab.known_hosts_path,
    )
    return fleet, lab.inventory_path


def gpumon_argv(inventory: Path, extra_vars: Sequence[str], *, check: bool = False) -> list[str]:
    argv = [str(GPUMON), "up", "-i", str(inventory), "--limit", LIMIT]
    for e in extra_vars:
        argv += ["-e", e]
    if check:
        argv.append("--check")
    return [*argv, "--output", "json"]


def changed_tasks(stdout: str) -> list[str]:
    """``host: task`` of every changed task in an ``--output json`` report (for suspects)."""
    start = stdout.find("\n{\n") + 1 if not stdout.startswith("{") else 0
    try:
        report, _ = json.JSONDecoder().raw_decode(stdout[start:])
    except ValueError:
        return []
    return [
        f"{host}: {t.get('task')}"
        for host, h in report.get("hosts", {}).items()
        for t in h.get("tasks", [])
        if t.get("changed")
    ]


class GpuStackBench:
    """One bench run on one lab: a Prepared fleet (SSH fan-out, floor, reset) plus the lab's
    inventory for gpumon-deploy itself."""

    def __init__(self, fleet: Fleet, inventory: Path, extra_vars: Sequence[str], work: Path):
        self.inventory = inventory
        self.extra_vars = tuple(extra_vars)
        self.floors: dict[str, str] = {}
        workload = Workload(
            name="gpu_stack",
            gpumon_site=Path(__file__).resolve().parent.parent / "site.yml",
            # gpumon-deploy and the floor only: the GPU roles have no ansible-core or pyinfra twin.
            ansible_playbook=Path(os.devnull),
            pyinfra_deploy=Path(os.devnull),
            floor_script=lambda t: self.floors[t.name],
            reset_script=lambda _t: reset_script(),
        )
        self.prepared = Prepared(fleet, workload, work)
        self.samples: list[Sample] = []
        self.resets: list[dict[str, Any]] = []

    def gpumon(self, scenario: str) -> Sample:
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as users run it: bytecode caches on
        got = run_measured(gpumon_argv(self.inventory, self.extra_vars), env=env, timeout_s=900)
        changed = gpumon_changed(got.stdout)
        note = ""
        if got.rc != 0:
            note = (got.stderr.strip() or got.stdout.strip())[-600:]
        elif scenario == "noop" and changed:
            note = "; ".join(changed_tasks(got.stdout))[:600]
        return Sample(
            "gpumon", scenario, got.wall_s, got.cpu_s, got.peak_rss_mib, got.rc, changed, note
        )

    def predicted(self) -> tuple[int, int | None]:
        """rc and predicted changes of ``up --check`` (not timed)."""
        got = run_measured(gpumon_argv(self.inventory, self.extra_vars, check=True), timeout_s=600)
        return got.rc, gpumon_changed(got.stdout)

    def fingerprints(self) -> dict[str, dict[str, list[str]]]:
        outcomes = self.prepared.ssh_all(lambda _t: FINGERPRINT_SCRIPT)
        out = {}
        for t, o in zip(self.prepared.fleet.hosts, outcomes, strict=True):
            if o.returncode != 0:
                raise RuntimeError(f"fingerprint of {t.name} failed: {o.stderr[-300:]}")
            out[t.name] = parse_fingerprint(o.stdout)
        return out

    def reset(self, baseline: Mapping[str, Mapping[str, Sequence[str]]]) -> dict[str, Any]:
        """Reset every host (not timed), then check it is back to ``baseline`` and that
        ``up --check`` predicts changes."""
        self.prepared.reset()
        now = self.fingerprints()
        left = {h: residue(baseline[h], now[h]) for h in now}
        rc, predicted = self.predicted()
        record = {
            "residue": {h: r for h, r in left.items() if r},
            "check_rc": rc,
            "check_predicted_changes": predicted,
        }
        self.resets.append(record)
        return record

    def record(self, s: Sample) -> None:
        self.samples.append(s)
        flag = "" if s.rc == 0 else f"  FAILED rc={s.rc}: {s.note}"
        print(
            f"  {s.scenario:<5} {s.tool:<7} {s.wall_s:7.3f}s  cpu {s.cpu_s:6.2f}s"
            f"  rss {s.peak_rss_mib:6.1f}MiB  changed={s.changed}{flag}",
            file=sys.stderr,
        )


def engine_tree() -> dict[str, Any]:
    """The commit the engine ran from and the engine files then modified but not committed
    (other engineers work in the same tree)."""
    import subprocess

    repo = BENCH_DIR.parent

    def git(*argv: str) -> str:
        got = subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True, check=False)
        return got.stdout.rstrip("\n")

    dirty = git("status", "--porcelain", "--", "deployer", "roles", "site.yml", "templates")
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted": dirty.splitlines()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    fleet, inventory = gpu_fleet(args.lab)
    host_machine = machine()
    engine = engine_tree()
    extra_vars = args.extra_vars if args.extra_vars is not None else list(LAB_EXTRA_VARS)
    bench = GpuStackBench(
        fleet, inventory, extra_vars, Path(args.workdir) / f"gpustack-{os.getpid()}"
    )
    names = [t.name for t in fleet.hosts]
    try:
        print(
            f"fleet: {', '.join(names)} of lab {args.lab!r}; reset to the baseline", file=sys.stderr
        )
        before = bench.fingerprints()
        bench.prepared.reset()
        baseline = bench.fingerprints()
        pristine = {h: not residue(before[h], baseline[h]) for h in names}
        bench.record(bench.gpumon("warm"))
        if bench.samples[-1].rc != 0:
            raise RuntimeError(f"the first converge failed: {bench.samples[-1].note}")
        reads = planned_reads(inventory, extra_vars)
        from deployer.facts import FACTS_SCRIPT

        bench.floors = {h: floor_script(FACTS_SCRIPT, reads[h]) for h in names}
        # Once, not timed: every part of the floor ran, and with what status.
        floor_check = {}
        for h, o in zip(names, bench.prepared.ssh_all(lambda t: bench.floors[t.name]), strict=True):
            got = floor_statuses(o.stdout)
            floor_check[h] = {
                "parts_ran": len(got),
                "parts_planned": 1 + len(reads[h]),
                "nonzero": {k: v for k, v in got.items() if v},
            }
        for n in range(args.runs):
            for tool in rotated(list(TOOLS), n):
                bench.record(
                    bench.gpumon("noop") if tool == "gpumon" else bench.prepared.floor("noop")
                )
        for _ in range(args.cold_runs):
            got = bench.reset(baseline)
            print(
                f"  reset: residue on {sorted(got['residue']) or 'no host'};"
                f" --check rc={got['check_rc']} predicts {got['check_predicted_changes']} changes",
                file=sys.stderr,
            )
            bench.record(bench.gpumon("cold"))
    finally:
        bench.prepared.close()

    measured = [s for s in bench.samples if s.scenario != "warm"]
    summaries = summarise(measured)
    wrong = [
        s
        for s in measured
        if s.rc != 0
        or (s.scenario == "noop" and s.changed != 0)
        or (s.scenario == "cold" and not s.changed)
    ]
    floor_incomplete = [h for h, c in floor_check.items() if c["parts_ran"] != c["parts_planned"]]
    bad_resets = [r for r in bench.resets if r["residue"] or not r["check_predicted_changes"]]
    by_tool = {s.tool: s.wall_s for s in summaries if s.scenario == "noop"}
    return {
        "benchmark": "gpustack",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python -m bench.gpustack", *sys.argv[1:]]),
        "lab": args.lab,
        "hosts": names,
        "gpumon_command": " ".join(gpumon_argv(inventory, extra_vars)),
        "floor": "one ssh per host, in parallel, ControlMaster=no: deployer.facts.FACTS_SCRIPT"
        " plus the read script of every planned task of the four GPU plays",
        "floor_reads_per_host": {h: len(reads[h]) for h in names},
        "floor_script_bytes": {h: len(bench.floors[h]) for h in names},
        "floor_parts": floor_check,
        "machine": host_machine,
        "versions": {"gpumon": tool_versions()["gpumon"]},
        "engine_at_start": engine,
        "runs": {"noop": args.runs, "cold": args.cold_runs},
        "hosts_pristine_at_start": pristine,
        "summaries": [s.to_json() for s in summaries],
        "ratio_noop_floor_over_gpumon": ratio(by_tool.get("floor"), by_tool.get("gpumon")),
        "resets": bench.resets,
        "suspect_runs": [s.to_json() for s in wrong],
        "suspect_resets": bad_resets,
        "floor_incomplete": floor_incomplete,
        "samples": [s.to_json() for s in bench.samples],
    }


def render(result: dict[str, Any]) -> str:
    lines = [summary_table(result["summaries"]), ""]
    r = result["ratio_noop_floor_over_gpumon"]
    if r:
        lines.append(
            f"noop: floor/gpumon = {r:.2f}: gpumon-deploy takes {1 / r:.2f}x the raw floor's time"
        )
    if result["suspect_runs"]:
        lines.append(f"WARNING: {len(result['suspect_runs'])} runs failed or changed unexpectedly")
    if result["floor_incomplete"]:
        lines.append(f"WARNING: the floor did not run every check on {result['floor_incomplete']}")
    if result["suspect_resets"]:
        lines.append(
            f"WARNING: {len(result['suspect_resets'])} resets left residue or predicted nothing"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpustack", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--lab", default="gstack", help="lab name (default: gstack)")
    parser.add_argument("--runs", type=int, default=5, help="no-op runs per tool (default 5)")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold runs (default 5)")
    parser.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=None,
        help=f"passed to `up` (default: {' '.join(LAB_EXTRA_VARS)}, what the lab mirror holds)",
    )
    parser.add_argument("--workdir", default="/var/cache/gpumon-bench", help="scratch directory")
    parser.add_argument(
        "--out", default=None, help="result JSON (default bench/results/gpustack-DATE.json)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.cold_runs < 0:
        parser.error("--runs must be >= 1 and --cold-runs >= 0")
    result = run(args)
    print(render(result))
    write_result(result, "gpustack", args.out)
    suspect = result["suspect_runs"] or result["suspect_resets"] or result["floor_incomplete"]
    return 1 if suspect else 0


if __name__ == "__main__":
    sys.exit(main())
