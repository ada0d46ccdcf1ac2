"""The choices of an ``upgrade-driver`` run: one ``RolloutOptions``, built by the command line,
checked before any host is contacted, persisted as it is in the run record (``state.json``,
``options``) and read back as it is on ``--resume`` (the invocation's own ``--to``, ``--limit``
and the like are then the record's). The defaults live here and nowhere else: the CLI shows them.

``Timeouts`` are the controller's own bounds (not options: no flag sets them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from deployer.errors import InputError
from deployer.rollout.batching import Amount

REBOOT_MODES = ("auto", "always", "never")
DRAIN_KINDS = ("slurm", "kubernetes", "command", "none")


@dataclass(frozen=True)
class RolloutOptions:
    limit: str | None = None
    extra_vars: tuple[str, ...] = ()
    canary: int = 1
    batch_size: str = "1"
    max_unavailable: str | None = None  # None: the batch size (or the canary, if larger)
    max_failures: int = 1
    drain: str = "none"
    drain_command: str | None = None
    drain_host: str | None = None
    pod_selector: str | None = None
    job_timeout: int = 600
    reboot: str = "auto"
    silence_minutes: int = 120
    diag_level: int = 2
    # Runs this controller has no record of whose drained nodes this run may take over (their
    # controller is gone): deployer/rollout/command.py, _earlier_run_owner.
    take_over: tuple[str, ...] = ()
    # The amounts in hosts, resolved once against the run's hosts (``for_hosts``).
    batch_size_hosts: int | None = None
    max_unavailable_hosts: int | None = None

    def check(self) -> None:
        """Bad amounts are input errors naming the option (before any host is contacted)."""
        Amount.parse(self.batch_size, "--batch-size")
        if self.max_unavailable is not None:
            Amount.parse(self.max_unavailable, "--max-unavailable")
        if self.canary < 0:
            raise InputError("--canary must be 0 or more", key="--canary")
        if self.max_failures < 1:
            raise InputError("--max-failures must be at least 1", key="--max-failures")

    def for_hosts(self, total: int) -> RolloutOptions:
        """These options with the amounts resolved for a run of ``total`` hosts."""
        self.check()
        batch = Amount.parse(self.batch_size, "--batch-size")
        batch_hosts = batch.of(total)
        if self.max_unavailable is None:
            max_unavailable = max(batch_hosts, self.canary, 1)
        else:
            max_unavailable = Amount.parse(self.max_unavailable, "--max-unavailable").of(total)
        return dataclasses.replace(
            self,
            batch_size=str(batch),
            batch_size_hosts=batch_hosts,
            max_unavailable_hosts=max_unavailable,
        )

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["extra_vars"] = list(self.extra_vars)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["extra_vars"] = tuple(values.get("extra_vars") or ())
        values["take_over"] = tuple(values.get("take_over") or ())
        return cls(**values)


@dataclass(frozen=True)
class Timeouts:
    """How long the controller waits for what the host does by itself after an upgrade."""

    exporter_s: int = 120  # the exporter to serve the new driver label
    prometheus_s: int = 240  # every replica to scrape the host with the new label
    reboot_s: int = 900  # the host to come back (nvidia_driver_reboot_timeout overrides it)


def target_overrides(target: dict[str, Any]) -> dict[str, str]:
    """The variables that point the GPU roles at the run's target driver, above the inventory
    (``-e`` included), for the rollout's own converges; the rollout reboots itself, so the role
    never does (``nvidia_driver_reboot: never``)."""
    return {
        "nvidia_driver_version": str(target["version"]),
        "nvidia_driver_branch": str(target["branch"]),
        "nvidia_driver_reboot": "never",
    }
