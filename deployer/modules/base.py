"""The module contract: a read side that probes state, a write side that only the engine calls.

A module never decides "changed" itself. It says what state it wants (``desired``), how to read the
actual state (``read_script`` + ``parse``), and how to write (``write``). The engine compares,
calls ``write`` only outside check mode, then reads again to prove the write worked.

Read scripts are plain POSIX shell that print state and change nothing; the engine may batch the
read scripts of many tasks into one round trip in one shell, so a script must not rely on or change
the working directory, must not ``exit``, must set every variable it reads (a variable may still
hold another task's value), and must write everything it reports to stdout. A read script ends with status 0
when it could read the state (whatever the state is); any other status means the read itself failed
(the task fails, or in check mode after an earlier change is reported as a predicted change).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from deployer.booleans import as_boolean
from deployer.connection import CommandFailed, CommandResult


class ArgError(Exception):
    """A task argument is missing, unknown or of the wrong type/value (an input error)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class Param:
    """One module argument: its type(s), whether required, default and allowed values."""

    types: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    choices: tuple[Any, ...] | None = None
    secret: bool = False


@dataclass(frozen=True)
class ContentDiff:
    """A file's content before and after (already masked when the content is secret)."""

    path: str
    before: str | None
    after: str | None


@dataclass
class Observation:
    """A task's actual state as read from the host, and how it differs from the desired state."""

    actual: dict[str, Any]
    differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def in_desired_state(self) -> bool:
        return not self.differences


class HostSession(Protocol):
    """What a module's write side may use on a host."""

    name: str

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult: ...

    def reconnect(self, deadline_s: float) -> None: ...


@dataclass
class PrepareContext:
    """What ``prepare`` may use at plan time, before any connection: file lookup and rendering."""

    find_file: Callable[[str, str], str]  # (kind 'files'|'templates', relative src) -> path
    render_template: Callable[[str], str]  # path -> rendered text


class Module:
    """Base class of modules. Subclasses set ``name`` and ``params`` and override the sides."""

    name: ClassVar[str]
    params: ClassVar[dict[str, Param]] = {}
    # Whether a successful write counts as a change (wait_for, for example, does not).
    reports_change: ClassVar[bool] = True
    # Whether the engine may append the read that proves a write to the write's own command (one
    # round trip fewer). Set it for modules whose write is one or two cheap commands that end
    # the shell normally (no reboot, no reconnect): each write command then pays for a read.
    write_then_read: ClassVar[bool] = False
    # A module with no write side (``assert``): the engine judges the task by its read alone,
    # failing it with ``explain`` when the state differs (check mode too, before any change).
    judged_by_read: ClassVar[bool] = False

    # ---- plan time (no host) -------------------------------------------------------------
    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Check and normalise arguments against ``params``; raise ArgError naming the key."""
        out: dict[str, Any] = {}
        for key in args:
            if key not in self.params:
                known = ", ".join(sorted(self.params))
                raise ArgError(key, f"unknown argument for module {self.name} (known: {known})")
        for key, spec in self.params.items():
            if key not in args or args[key] is None:
                if spec.required:
                    raise ArgError(key, f"required by module {self.name}")
                out[key] = spec.default
                continue
            value = args[key]
            if spec.types is int and isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if spec.types is bool or (isinstance(spec.types, tuple) and bool in spec.types):
                value = _coerce_bool(key, value) if isinstance(value, str) else value
            if not isinstance(value, spec.types) or (isinstance(value, bool) and spec.types is int):
                raise ArgError(
                    key, f"expected {_type_name(spec.types)}, got {type(value).__name__}"
                )
            if spec.choices is not None and value not in spec.choices:
                raise ArgError(key, f"must be one of {', '.join(map(str, spec.choices))}")
            out[key] = value
        self.check(out)
        return out

    def check(self, args: dict[str, Any]) -> None:
        """Cross-argument validation; raise ArgError."""

    def prepare(self, args: dict[str, Any], ctx: PrepareContext) -> dict[str, Any]:
        """Resolve plan-time inputs (read a source file, render a template). Default: as is."""
        return args

    def secret_args(self, args: dict[str, Any]) -> set[str]:
        return {k for k, p in self.params.items() if p.secret}

    # ---- read side -----------------------------------------------------------------------
    def read_script(self, args: dict[str, Any]) -> str:
        raise NotImplementedError

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        raise NotImplementedError

    def baseline_script(self, args: dict[str, Any]) -> str | None:
        """For an action whose effect a later read can tell (a restart: a newer invocation), a
        read-only script whose output, taken when the action becomes owed, lets :meth:`parse`
        judge whether it has happened since. None (the default): the action always acts.

        The engine runs it on the host just before each change that notifies this task as a
        handler, keeps the output with the owed handler (on the host, see deployer/owed.py)
        and passes it as ``baseline``; such a handler then acts only when its state says so.
        """
        return None

    def state_tells_writes(self, args: dict[str, Any]) -> bool:
        """Whether a read shows every effect of a write (so a failed write whose read is
        unchanged changed nothing). False for a command with no guard: it may have done anything."""
        return True

    def takes_down(self, args: dict[str, Any], obs: Observation) -> str | None:
        """What this task's write would take out of service, in words ("restart of
        prometheus.service"), when the write would stop a running service; None when it would
        not. The engine checks a task's HA peers (``ha_peers``) only for such writes."""
        return None

    def diagnose(self, args: dict[str, Any], session: HostSession) -> str | None:
        """Read-only: what to add to the error when this task's state still differs after
        its write (a unit's state and last journal lines, say). None: nothing to add."""
        return None

    def note(self, args: dict[str, Any], obs: Observation) -> str | None:
        """A module ``judged_by_read``: a remark on a state that passes (ReadOnlyCheck)."""
        return None

    def explain(self, args: dict[str, Any], session: HostSession, obs: Observation) -> str:
        """Read-only: why the state differs, for a module ``judged_by_read``."""
        return ""

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Keys whose actual value differs from the desired one: {key: (before, after)}."""
        return {
            k: (actual.get(k), v)
            for k, v in self.desired(args).items()
            if v is not None and actual.get(k) != v
        }

    def observe(
        self,
        args: dict[str, Any],
        result: CommandResult,
        *,
        before: Observation | None = None,
        baseline: str | None = None,
    ) -> Observation:
        """The state read by ``result``, compared with the desired state.

        ``before`` is given only to the read that verifies this task's own write: the
        observation the write started from (what an action such as a restart is proven
        against). ``baseline`` is the output of :meth:`baseline_script` taken before the change
        that made a handler owed. Modules that need neither keep this default, which judges
        ``result`` alone; the others override it (so no proof is kept on the instance).
        """
        actual = self.parse(args, result)
        return Observation(actual=actual, differences=self.compare(args, actual))

    def content_diff(
        self, args: dict[str, Any], session: HostSession, obs: Observation
    ) -> ContentDiff | None:
        """For --diff: the content before/after when content differs (read-only)."""
        return None

    # ---- write side (the engine calls this only outside check mode) ------------------------
    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        raise NotImplementedError


class ReadOnlyCheck(Module):
    """A module with no write side (``assert``, ``disk_space``, ``boot_loader``,
    ``module_signing``): judged by its read alone, never a change; a state that differs fails the
    task with :meth:`Module.explain`."""

    reports_change = False
    judged_by_read = True

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        raise RuntimeError(f"{self.name} is a read-only check: it has no write side")

    def note(self, args: dict[str, Any], obs: Observation) -> str | None:
        """A remark on a state that passes -- what the check could not judge -- reported with
        the task's ok (``upgrade-driver``'s preflight says the same as a NOTE): the read's
        ``note``, where its parse gives one."""
        return str(obs.actual.get("note") or "") or None


def _coerce_bool(key: str, value: str) -> bool:
    found = as_boolean(value)
    if found is None:
        raise ArgError(key, f"expected a boolean, got {value!r}")
    return found


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def q(value: Any) -> str:
    """Shell-quote one value."""
    return shlex.quote(str(value))


def run_checked(
    session: HostSession, command: str, *, stdin: bytes | None = None, timeout: float | None = None
) -> CommandResult:
    """Run a write-side command and raise CommandFailed unless it exits 0."""
    result = session.run(command, stdin=stdin, timeout=timeout)
    if result.rc != 0:
        raise CommandFailed(result)
    return result


def parse_kv(text: str) -> dict[str, str]:
    """Parse ``key=value`` lines (the convention read scripts use to report state)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


MODULES: dict[str, type[Module]] = {}


def register(cls: type[Module]) -> type[Module]:
    """Class decorator: make a module available to tasks under its ``name``."""
    if cls.name in MODULES:
        raise RuntimeError(f"module {cls.name} registered twice")
    MODULES[cls.name] = cls
    return cls
