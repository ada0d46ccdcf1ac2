"""The persisted record of an ``upgrade-driver`` run: every host's step, and the run's options.

Owns the per-host state machine's vocabulary (``STEPS``, terminal and out-of-service states, the
allowed transitions) and the run directory on the controller:
``$GPUMON_ROLLOUT_STATE_DIR/<run-id>/state.json`` (default
``~/.local/state/gpumon-deploy/runs``). The file is rewritten after every transition, atomically
(a temporary file in the same directory, flushed and fsynced, renamed over the old one, then the
directory fsynced), so a controller killed at any instant leaves either the previous or the next
state, never a torn one. A lock file (``flock``) keeps a second controller off a run in progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer import run_lock
from deployer.errors import InputError
from deployer.rollout.options import RolloutOptions
from deployer.spans import span

STATE_DIR_ENV = "GPUMON_ROLLOUT_STATE_DIR"
STATE_FILE = "state.json"
REPORT_FILE = "report.json"
LOCK_FILE = "lock"
SCHEMA = 1

# The per-host state machine, in order. A host enters a step, does it (each step is idempotent:
# running it again after a crash is harmless), then moves to the next.
STEPS = (
    "pending",
    "draining",  # the drain hook: the scheduler stops placing work; existing jobs finish
    "waiting_jobs",  # bounded wait until nvidia-smi lists no compute process
    "silencing",  # Alertmanager silences for the host's alerts
    "stopping",  # dcgm-exporter, nv-hostengine, persistenced, fabric manager stopped
    "installing",  # the GPU roles converged with the target driver
    "rebooting",  # reboot (or module reload) into the new kernel module
    "starting",  # the GPU roles converged again: services up on the new driver
    "validating",  # loaded == target, every GPU seen, dcgmi health/diag, exporter, Prometheus
    "recording",  # the target written on the host, where `up` and `check` read it
    "undraining",  # the drain hook's resume (only when the run drained the host)
    "unsilencing",  # the silences expired
    "done",
)
FAILED = "failed"
SKIPPED = "skipped"
TERMINAL = frozenset({"done", FAILED, SKIPPED})
# Steps during which the host is out of service (counted against --max-unavailable): from the
# drain until the scheduler has it back.
OUT_OF_SERVICE = frozenset(STEPS[STEPS.index("draining") : STEPS.index("unsilencing")])


def next_step(step: str) -> str:
    """The step after ``step`` on the success path."""
    i = STEPS.index(step)
    if step == "done":
        raise ValueError("done is the last step")
    return STEPS[i + 1]


def state_root() -> Path:
    configured = os.environ.get(STATE_DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpumon-deploy" / "runs"


def new_run_id(target_version: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now or time.time()))
    return f"{stamp}-{target_version}-{secrets.token_hex(2)}"


@dataclass
class HostRecord:
    """One host's progress. ``history`` holds ``[step, unix time]`` for every step entered."""

    host: str
    batch: int
    state: str = "pending"
    reason: str | None = None  # why it failed or was skipped
    failed_step: str | None = None
    was_drained: bool | None = None  # drained by someone else before the run touched it
    drained_by_run: bool = False
    # failed before anything changed on it (GPU jobs at --job-timeout) and resumed: in service
    returned: bool = False
    silence_ids: list[str] = field(default_factory=list)
    silence_peer: str | None = None
    before: dict[str, Any] = field(default_factory=dict)  # versions seen at preflight
    # the driver variables the inventory gave the host when the run started (driver_record)
    inventory_driver: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)  # versions the target resolves to
    history: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def out_of_service(self) -> bool:
        """Out of service now: between draining and validating, or failed after draining began
        (a failed host stays drained and silenced, unless it failed before anything changed on
        it and the run gave it back to the scheduler)."""
        if self.state in OUT_OF_SERVICE:
            return True
        if self.returned:
            return False
        return self.state == FAILED and self.failed_step not in (None, "pending")

    def entered(self, step: str) -> float | None:
        """When the host last entered ``step`` (None if never)."""
        times = [t for s, t in self.history if s == step]
        return times[-1] if times else None


@dataclass
class RunRecord:
    run_id: str
    inventory: str
    target: dict[str, Any]  # requested, branch, version, listed
    options: RolloutOptions
    batches: list[list[str]]
    hosts: dict[str, HostRecord]
    unavailable_before: dict[str, str] = field(default_factory=dict)  # host -> why
    status: str = "running"  # running | interrupted | stopped | finished
    stop_reason: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    schema: int = SCHEMA

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["options"] = self.options.to_json()
        data["hosts"] = {h: dataclasses.asdict(r) for h, r in self.hosts.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        if data.get("schema") != SCHEMA:
            raise InputError(f"run state schema {data.get('schema')!r} is not {SCHEMA}")
        hosts = {h: HostRecord(**r) for h, r in data["hosts"].items()}
        options = RolloutOptions.from_json(data["options"])
        fields = {f.name for f in dataclasses.fields(cls)} - {"hosts", "options"}
        return cls(**{k: v for k, v in data.items() if k in fields}, hosts=hosts, options=options)

    def failures(self) -> list[str]:
        return [h for h, r in self.hosts.items() if r.state == FAILED]

    def out_of_service(self) -> set[str]:
        """Hosts out of service now: this run's hosts between drain and validation (or failed
        after drain), and hosts that were down or drained before the run, until this run owns
        their drain (one it took over from an earlier run, or drained again after someone
        resumed it): from then on their own step says, and once validated they are back."""
        # A host someone else drained before the run stays drained after it (never undrained).
        own = {h for h, r in self.hosts.items() if r.out_of_service}
        before = {
            h
            for h in self.unavailable_before
            if h not in self.hosts or not self.hosts[h].drained_by_run
        }
        return own | before


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text`` so that a crash leaves the old or the new file whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class StateStore:
    """The run directory of one run: load, save after every transition, lock, report."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.path = run_dir / STATE_FILE
        self._lock = threading.Lock()
        self._lock_fd: int | None = None

    @classmethod
    def create(cls, record: RunRecord, root: Path | None = None) -> StateStore:
        run_dir = (root or state_root()) / record.run_id
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir(mode=0o700)
        store = cls(run_dir)
        store.save(record)
        return store

    @classmethod
    def find(cls, run: str, root: Path | None = None) -> StateStore:
        """A run by id (under the state root) or by the path of its directory."""
        candidates = [Path(run), (root or state_root()) / run]
        for c in candidates:
            if (c / STATE_FILE).is_file():
                return cls(c)
        raise InputError(
            f"no run {run!r}: no {STATE_FILE} in {candidates[1]} (set {STATE_DIR_ENV} to where "
            "the run was started, or pass the run directory)",
            key="--resume",
        )

    def load(self) -> RunRecord:
        try:
            data = json.loads(self.path.read_text())
        except ValueError as exc:
            raise InputError(f"{self.path} is not valid JSON: {exc}", key="--resume") from exc
        return RunRecord.from_json(data)

    def save(self, record: RunRecord) -> None:
        with self._lock, span("state_write"):
            record.updated = time.time()
            write_atomic(self.path, json.dumps(record.to_json(), indent=1, sort_keys=True) + "\n")

    def write_report(self, report: dict[str, Any]) -> Path:
        path = self.dir / REPORT_FILE
        write_atomic(path, json.dumps(report, indent=2, sort_keys=True) + "\n")
        return path

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run's lock for the life of the controller, its pid in the file (which
        ``status`` reads, deployer/monitoring/rollouts.py); another holder is an input error."""
        lock = self.dir / LOCK_FILE

        def refused(_: str) -> InputError:
            return InputError(
                f"run {self.dir.name} is being driven by another controller (lock {lock})",
                key="--resume",
            )

        with run_lock.exclusive(lock, str(os.getpid()), refused):
            yield
