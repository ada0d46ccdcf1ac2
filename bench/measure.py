"""Measuring one tool run (wall time, CPU seconds, peak RSS of the process tree) and summarising
repeated runs (medians, ratios); the parsers that count what each tool says it changed."""

from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sample:
    """One run of one tool."""

    tool: str
    scenario: str
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    rc: int
    changed: int | None = None
    note: str = ""

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        for k in ("wall_s", "cpu_s", "peak_rss_mib"):
            out[k] = round(float(out[k]), 4)
        return out


@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    peak_rss_mib: float


def run_measured(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> Outcome:
    """Run ``argv`` to completion; CPU time and peak RSS come from ``wait4`` on the child, so
    they cover the child and every descendant it waited for (Ansible's forked workers)."""
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}-{time.time_ns()}"
    with open(f"{out_path}.out", "w+b") as out, open(f"{out_path}.err", "w+b") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
        deadline = started + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    os.unlink(f"{out_path}.out")
    os.unlink(f"{out_path}.err")
    return Outcome(
        rc=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_mib=usage.ru_maxrss / 1024.0,
    )


# ---------------------------------------------------------------- what each tool changed

_ANSIBLE_RECAP = re.compile(
    r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
)


def ansible_changed(stdout: str) -> int | None:
    """Sum of ``changed=`` over the PLAY RECAP; None when there is no recap or a host
    failed or was unreachable."""
    rows = _ANSIBLE_RECAP.findall(stdout)
    if not rows:
        return None
    if any(int(r[3]) or int(r[4]) for r in rows):
        return None
    return sum(int(r[2]) for r in rows)


_PYINFRA_TOTAL = re.compile(r"^\s*Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", re.M)


def pyinfra_changed(output: str) -> int | None:
    """Operations pyinfra ran with a change ("Success" of its results' Grand total); None when
    the table is absent or any operation failed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", output)
    m = _PYINFRA_TOTAL.search(text)
    if m is None:
        return None

    def count(cell: str) -> int:
        return 0 if cell == "-" else int(cell)

    if count(m.group(3)):
        return None
    return count(m.group(2))


def _gpumon_report(stdout: str) -> dict[str, Any] | None:
    m = re.search(r"^\{$", stdout, re.M)
    if m is None:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(stdout[m.start() :])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def gpumon_failures(stdout: str, limit: int = 3) -> str:
    """Why a ``gpumon-deploy up --output json`` run failed: the first failed or unreachable
    hosts with their errors ("" when the report names none)."""
    report = _gpumon_report(stdout) or {}
    lines = []
    for name, h in report.get("hosts", {}).items():
        if h.get("unreachable"):
            lines.append(f"{name}: unreachable: {h['unreachable']}")
        elif h.get("failed"):
            errors = [t for t in h.get("tasks", []) if t.get("status") == "failed"]
            what = f"{errors[0].get('task')}: {errors[0].get('error')}" if errors else "failed"
            lines.append(f"{name}: {what}")
    more = len(lines) - limit
    return "\n".join(lines[:limit] + ([f"... and {more} more hosts"] if more > 0 else []))


def gpumon_changed(stdout: str) -> int | None:
    """Changed tasks in a ``gpumon-deploy up --output json`` report; None on any failure."""
    report = _gpumon_report(stdout)
    if report is None:
        return None
    hosts = report.get("hosts", {})
    if not hosts:
        return None
    total = 0
    for h in hosts.values():
        if h.get("failed") or h.get("unreachable"):
            return None
        total += sum(1 for t in h.get("tasks", []) if t.get("changed"))
    return total


# ---------------------------------------------------------------- summaries


@dataclass
class Summary:
    """Medians of one tool in one scenario."""

    tool: str
    scenario: str
    runs: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    walls: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "tool": self.tool,
            "scenario": self.scenario,
            "runs": self.runs,
            "median_wall_s": round(self.wall_s, 4),
            "median_cpu_s": round(self.cpu_s, 4),
            "median_peak_rss_mib": round(self.peak_rss_mib, 1),
            "walls_s": [round(w, 4) for w in self.walls],
        }


def summarise(samples: Sequence[Sample]) -> list[Summary]:
    """Medians per (tool, scenario), in first-seen order; failed runs are left out."""
    keys: list[tuple[str, str]] = []
    for s in samples:
        if (s.tool, s.scenario) not in keys:
            keys.append((s.tool, s.scenario))
    out = []
    for tool, scenario in keys:
        good = [s for s in samples if (s.tool, s.scenario) == (tool, scenario) and s.rc == 0]
        if not good:
            continue
        out.append(
            Summary(
                tool=tool,
                scenario=scenario,
                runs=len(good),
                wall_s=statistics.median(s.wall_s for s in good),
                cpu_s=statistics.median(s.cpu_s for s in good),
                peak_rss_mib=statistics.median(s.peak_rss_mib for s in good),
                walls=[s.wall_s for s in good],
            )
        )
    return out


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def rotated(items: Sequence[str], round_no: int) -> list[str]:
    """``items`` rotated by ``round_no``: each tool goes first in turn, so slow drifts in the
    machine's load hit every tool alike."""
    if not items:
        return []
    k = round_no % len(items)
    return [*items[k:], *items[:k]]


def write_result(result: Mapping[str, Any], benchmark: str, out: str | None) -> Path:
    """Write a run's result as JSON to ``out`` or bench/results/<benchmark>-<date>.json and say
    where."""
    path = (
        Path(out)
        if out
        else Path(__file__).parent
        / "results"
        / f"{benchmark}-{datetime.date.today().isoformat()}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {path}")
    return path


def summary_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """The medians of each (scenario, tool), as the scripts print them."""
    rows = [["scenario", "tool", "median wall s", "median cpu s", "peak rss MiB", "runs"]]
    for s in summaries:
        rows.append(
            [
                s["scenario"],
                s["tool"],
                f"{s['median_wall_s']:.3f}",
                f"{s['median_cpu_s']:.2f}",
                f"{s['median_peak_rss_mib']:.0f}" if s["tool"] != "floor" else "-",
                str(s["runs"]),
            ]
        )
    return table(rows)


def table(rows: Sequence[Sequence[str]]) -> str:
    """A plain text table, first row the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
