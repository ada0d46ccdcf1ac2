"""The driver a completed ``upgrade-driver`` run left on a GPU host, recorded on that host.

Why it exists: a rolling upgrade moves a host's driver away from what the inventory says (the
inventory is edited afterwards, or never). Without a record the next ``up`` would plan the
inventory's driver again and, since ``up`` never changes a loaded driver (``preflight``), refuse
every upgraded host. With it, ``up`` and ``check`` keep the driver the rollout put there for as
long as the inventory still says what it said when the run started; once the inventory says
something else, that is a new wish and the inventory is planned again (and a change on a live
host refused, naming ``upgrade-driver``).

The record lives on the host (``RECORD_PATH``, JSON, root-owned, 0644), not on the controller:
every controller, CI runner and operator sees the same one, and a host reinstalled from scratch
loses the record together with the driver it describes. It only ever lets ``up`` keep a loaded
driver; a missing, unreadable or foreign record makes ``up`` plan the inventory, which is refused
on a live host if it differs from the loaded driver -- so a damaged record can cause a refusal,
never a driver change. ``upgrade-driver`` writes it when a host has passed validation (the
``recording`` step); the ``nvidia_driver`` role removes it when ``up`` installs another driver
(a first install, or ``--out-of-service``), since it no longer describes the host.

Public API: ``DriverRecord``, ``inventory_driver(variables)``, ``READ_COMMAND``,
``parse(text)``, ``write_command(record)``, ``RECORD_PATH``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

RECORD_PATH = "/var/lib/gpumon/nvidia-driver.json"
SCHEMA = 1
# Read-only; prints nothing when there is no record.
READ_COMMAND = f"cat {RECORD_PATH} 2>/dev/null || true"
DRIVER_VARS = ("nvidia_driver_version", "nvidia_driver_branch")


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    return text or None


def inventory_driver(variables: Mapping[str, Any]) -> dict[str, str | None]:
    """The driver variables as a host's inventory (and ``-e``) resolve them, verbatim: what a
    record compares with to tell a lagging inventory from a changed one. ``None`` for unset (the
    matrix's default branch, which may move with a new release of this tool: a record then keeps
    the rolled-out driver instead of following it)."""
    return {
        "version": _text(variables.get("nvidia_driver_version")),
        "branch": _text(variables.get("nvidia_driver_branch")),
    }


@dataclass(frozen=True)
class DriverRecord:
    """What ``upgrade-driver`` run ``run_id`` left on the host: driver ``version`` of ``branch``,
    validated at ``finished`` (unix time), while the inventory said ``inventory``."""

    version: str
    branch: str
    run_id: str
    finished: float
    inventory: dict[str, str | None]
    schema: int = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describes(self, variables: Mapping[str, Any]) -> bool:
        """True when the inventory still says what it said when the run started (it lags behind
        the host): the record, not the inventory, then names the host's driver."""
        return inventory_driver(variables) == self.inventory

    def variables(self) -> dict[str, str]:
        """The driver variables that plan this record's driver."""
        return {"nvidia_driver_version": self.version, "nvidia_driver_branch": self.branch}


def parse(text: str) -> DriverRecord | None:
    """The record in ``text`` (the output of ``READ_COMMAND``); None when there is none or it is
    not a record of this schema (treated as no record: see the module docstring)."""
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    inventory = data.get("inventory")
    try:
        record = DriverRecord(
            version=str(data["version"]),
            branch=str(data["branch"]),
            run_id=str(data["run_id"]),
            finished=float(data["finished"]),
            inventory={
                "version": _text(inventory.get("version")),
                "branch": _text(inventory.get("branch")),
            },
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return record


def write_command(record: DriverRecord) -> str:
    """A shell command writing ``record`` atomically (temporary file, rename) as root, 0644."""
    text = json.dumps(record.to_json(), sort_keys=True)
    tmp = f"{RECORD_PATH}.tmp"
    directory = RECORD_PATH.rsplit("/", 1)[0]
    return (
        f"umask 022 && mkdir -p {directory} && printf '%s\\n' {shlex.quote(text)} > {tmp} "
        f"&& sync {tmp} && mv -f {tmp} {RECORD_PATH}"
    )
