"""What people see of a rollout: the ``--check`` plan, the live table while it runs, the JSON
report at the end.

The live table (rich) is drawn on stderr when it is a terminal; otherwise every transition is one
line on stderr, so logs of a CI job read top to bottom. The JSON report is the run record plus a
summary; it is written to the run directory and, with ``--output json``, to stdout.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from deployer.rollout.controller import View
from deployer.rollout.state import FAILED, SKIPPED, RunRecord

_STYLE = {"done": "green", FAILED: "bold red", SKIPPED: "cyan", "pending": "dim"}


class LiveView(View):
    def __init__(self, stream: TextIO, *, live: bool | None = None) -> None:
        self.console = Console(file=stream, highlight=False, soft_wrap=True, force_terminal=live)
        self.live_mode = self.console.is_terminal
        self._details: dict[str, str] = {}
        self._record: RunRecord | None = None
        self._live: Live | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> LiveView:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._refresh()
            self._live.__exit__(*exc)
            self._live = None

    def changed(self, record: RunRecord, host: str) -> None:
        with self._lock:
            self._record = record
            r = record.hosts[host]
            self._details[host] = r.reason or ""
        if self._live is None:
            extra = f" ({r.reason})" if r.reason else ""
            self.console.print(f"{time.strftime('%H:%M:%S')} {host}: {r.state}{extra}")
        else:
            self._refresh()

    def detail(self, host: str, text: str) -> None:
        with self._lock:
            self._details[host] = text
        if self._live is not None:
            self._refresh()

    def message(self, text: str) -> None:
        self.console.print(f"{time.strftime('%H:%M:%S')} {text}")

    def _refresh(self) -> None:
        if self._live is None or self._record is None:
            return
        with self._lock:
            self._live.update(table(self._record, self._details))


def table(record: RunRecord, details: dict[str, str] | None = None) -> Table:
    t = Table(title=f"upgrade-driver {record.run_id} -> {record.target['version']}")
    for col in ("batch", "host", "state", "since", "detail"):
        t.add_column(col)
    for batch_index, batch in enumerate(record.batches):
        for h in batch:
            r = record.hosts[h]
            since = r.history[-1][1] if r.history else None
            t.add_row(
                str(batch_index + 1)
                + (" (canary)" if batch_index == 0 and record.options.canary else ""),
                h,
                f"[{_STYLE.get(r.state, 'yellow')}]{r.state}[/]",
                time.strftime("%H:%M:%S", time.localtime(since)) if since else "",
                (details or {}).get(h) or r.reason or "",
            )
    for h, r in record.hosts.items():
        if r.batch < 0:
            t.add_row("-", h, f"[{_STYLE.get(r.state, 'yellow')}]{r.state}[/]", "", r.reason or "")
    return t


def report(record: RunRecord) -> dict[str, Any]:
    data = record.to_json()
    states: dict[str, list[str]] = {}
    for h, r in record.hosts.items():
        states.setdefault(r.state, []).append(h)
    data["summary"] = {
        "status": record.status,
        "stop_reason": record.stop_reason,
        "target": record.target["version"],
        "hosts": {s: sorted(hs) for s, hs in states.items()},
        "failed": {h: record.hosts[h].reason for h in record.failures()},
    }
    return data


def plan_text(plan: dict[str, Any]) -> str:
    """The ``--check`` plan as text (``plan`` from ``rollout.check_plan``)."""
    out = [
        f"upgrade-driver plan: driver {plan['target']['version']} "
        f"(R{plan['target']['branch']}, from --to {plan['target']['requested']})",
        f"  canary {plan['options']['canary']}, batch size {plan['options']['batch_size']}, "
        f"max unavailable {plan['options']['max_unavailable_hosts']} host(s), "
        f"max failures {plan['options']['max_failures']}, drain {plan['options']['drain']}, "
        f"reboot {plan['options']['reboot']}",
    ]
    for h, why in plan["unavailable_before"].items():
        out.append(f"  out of service before the run: {h} ({why})")
    for h, hp in plan["hosts"].items():
        if hp["skip"]:
            out.append(f"  {h}: SKIPPED: {hp['skip']}")
    for i, batch in enumerate(plan["batches"]):
        out.append(f"batch {i + 1}{' (canary)' if i == 0 and plan['options']['canary'] else ''}:")
        for h in batch:
            hp = plan["hosts"][h]
            b, a = hp["before"], hp["after"]
            out.append(
                f"  {h}: driver {b['driver_installed'] or 'none'} (loaded {b['driver_loaded'] or 'none'}, "
                f"{b['module_flavour'] or '-'}) -> {a['driver_version']} ({a['module_flavour']}, CUDA {a['cuda_major']})"
            )
            out.append(
                f"    DCGM {b['dcgm_version'] or 'none'} ({b['dcgm_package'] or '-'}) -> "
                f"{a['dcgm_version']} ({', '.join(a['dcgm_packages'])}); exporter "
                f"{b['exporter_version'] or 'none'} -> {a['exporter_tag']}"
                + (
                    f"; Fabric Manager {b['fabricmanager_version'] or 'none'} -> {a['fabricmanager_version']}"
                    if a["fabricmanager_version"]
                    else ""
                )
            )
            out.append(f"    install: {' '.join(a['install'])}")
            if a["remove"]:
                out.append(f"    remove: {' '.join(a['remove'])}")
            for note in a["notes"]:
                out.append(f"    note: {note}")
            out.append(f"    drain: {hp['drain']}")
            out.append(f"    silence: {hp['silence']}")
    return "\n".join(out)
