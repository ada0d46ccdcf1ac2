"""A host as the executor sees it during one run: its kept connection (``HostState``), the
sessions a module's sides get (``ReadSession``, ``WriteSession``), and the batched reads of many
tasks in one round trip, kept per host and play in ``PlayReads``.

A batch is one shell script: each task's read script in a group followed by a marker line with a
random token and the script's exit status, so the output splits back per task; a part whose marker
is missing reads as None (read again on its own). The file probes of a batch's reads come first,
answered together by one ``stat`` and one ``sha256sum`` (deployer/modules/probe.py), and each
read's result is rebuilt as the read prints alone.
"""

from __future__ import annotations

import secrets as pyrandom
import time
from collections.abc import Callable
from dataclasses import dataclass

from deployer import owed
from deployer.connection import CommandResult, Connection
from deployer.errors import HostUnreachable
from deployer.modules import probe
from deployer.plan import HostPlay, PlannedTask

Connector = Callable[[str], Connection]


class ReadSession:
    """What check mode and the read side get: a connection whose commands are reads."""

    def __init__(self, host: HostState) -> None:
        self._host = host
        self.name = host.name

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        return self._host.conn().run(command, stdin=stdin, timeout=timeout)

    def reconnect(self, deadline_s: float) -> None:
        raise RuntimeError("reconnect is a write-side operation")


class WriteSession(ReadSession):
    """The write side's session; the executor creates one only outside check mode.

    With ``then_read`` (for modules whose ``write_then_read`` is set), every write command is
    followed, in the same round trip and only if it succeeded, by the batched reads of those
    tasks; ``reads`` keeps the reads that followed the last write command.
    """

    def __init__(
        self,
        host: HostState,
        then_read: list[PlannedTask] | None = None,
        first: str | None = None,
    ) -> None:
        super().__init__(host)
        self._scripts = [t.module.read_script(t.args) for t in then_read or []]
        self.reads: list[CommandResult | None] | None = None
        # Shell that runs before the first write command, in the same round trip (the record
        # of the handlers this write will owe); ``first_ran`` says whether it went out.
        self._first = first
        self.first_ran = False

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.reads = None
        if self._first is not None:
            command, self._first, self.first_ran = self._first + command, None, True
        if not self._scripts:
            return super().run(command, stdin=stdin, timeout=timeout)
        token = pyrandom.token_hex(8)
        marker = f"@@{token} write "
        script = (
            f"( {command}\n)\nrc=$?\nprintf '\\n{marker}%d@@\\n' \"$rc\"\n"
            f'if [ "$rc" -eq 0 ]; then\n{_batch_script(self._scripts, token)}\nfi\nexit "$rc"'
        )
        result = super().run(script, stdin=stdin, timeout=timeout)
        pos = result.stdout.rfind(f"\n{marker}")
        if pos < 0:  # the command's own output is all there is (the shell did not get that far)
            return CommandResult(command, result.rc, result.stdout, result.stderr)
        if result.rc == 0:
            after = result.stdout[pos + 1 :]
            self.reads = _split_batch(after[after.index("@@\n") + 3 :], self._scripts, token)
        return CommandResult(command, result.rc, result.stdout[:pos], result.stderr)

    def reconnect(self, deadline_s: float) -> None:
        self.reads = None
        self._host.reconnect(deadline_s)


class HostState:
    def __init__(self, name: str, connector: Connector) -> None:
        self.name = name
        self._connector = connector
        self._conn: Connection | None = None
        # The host's owed handlers by owed.key (None until read, once per run), and those
        # that were owed when this run began (an earlier run's).
        self.owed: dict[str, owed.OwedHandler] | None = None
        self.owed_at_start: dict[str, owed.OwedHandler] = {}

    def conn(self) -> Connection:
        if self._conn is None:
            self._conn = self._connector(self.name)
        return self._conn

    def reconnect(self, deadline_s: float) -> None:
        """Drop the connection and connect again, retrying until ``deadline_s`` seconds pass."""
        self.close()
        end = time.monotonic() + deadline_s
        last: Exception | None = None
        while time.monotonic() < end:
            try:
                self._conn = self._connector(self.name)
                return
            except HostUnreachable as exc:
                last = exc
                time.sleep(2)
        raise HostUnreachable(f"{self.name}: did not come back within {deadline_s:.0f}s: {last}")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def batch_read(conn: Connection, tasks: list[PlannedTask]) -> list[CommandResult | None]:
    """Run every task's read script in one command; split the output per task.

    A task whose part of the output cannot be found gets None and is read again on its own.
    """
    return batch_run(conn, [t.module.read_script(t.args) for t in tasks])


def batch_run(conn: Connection, scripts: list[str]) -> list[CommandResult | None]:
    """Run read-only ``scripts`` in one command; split the output per script (None: not found)."""
    if not scripts:
        return []
    token = pyrandom.token_hex(8)
    result = conn.run(_batch_script(scripts, token))
    return _split_batch(result.stdout, scripts, token)


def run_then_read(
    conn: Connection, command: str, scripts: list[str]
) -> tuple[CommandResult, list[CommandResult | None]]:
    """``command`` (in a subshell: the reads see the shell as a fresh one) then read-only
    ``scripts``, in one round trip: ``command``'s result, and the scripts' split per script
    (None: not found). The facts command and the first play's reads share a round trip so."""
    token = pyrandom.token_hex(8)
    marker = f"\n@@{token} first "
    result = conn.run(
        f"( {command}\n)\nprintf '\\n@@{token} first %d@@\\n' $?\n" + _batch_script(scripts, token)
    )
    pos = result.stdout.rfind(marker)
    end = result.stdout.find("@@\n", pos + len(marker)) if pos >= 0 else -1
    if end < 0:  # the shell did not get that far: no read is current
        return CommandResult(command, result.rc, result.stdout, result.stderr), [None] * len(
            scripts
        )
    rc = int(result.stdout[pos + len(marker) : end])
    first = CommandResult(command, rc, result.stdout[:pos], result.stderr)
    return first, _split_batch(result.stdout[end + 3 :], scripts, token)


def first_read_scripts(hp: HostPlay, owed_dir: str) -> tuple[list[int], list[str]]:
    """The first batched read of a host in a run, for play ``hp``: the host's owed handlers,
    then every module task's read script; with the tasks' positions in the play."""
    positions = [i for i, t in enumerate(hp.tasks) if not t.flush_handlers]
    scripts = [hp.tasks[i].module.read_script(hp.tasks[i].args) for i in positions]
    return positions, [owed.read_script(owed_dir), *scripts]


@dataclass(frozen=True)
class Prefetched:
    """A host's first batched read taken before the executor ran (with its facts): used by the
    executor instead of its own first read only when its scripts are exactly these."""

    scripts: tuple[str, ...]
    results: tuple[CommandResult | None, ...]


def _batch_script(scripts: list[str], token: str) -> str:
    # The file probes of the scripts are answered first, together (deployer/modules/probe.py);
    # each script then runs what is left of it.
    probes = probe.batched(scripts)
    parts = [probe.batch_script(probes, token)] if probes else []
    for i, script in enumerate(scripts):
        own = probe.left_to_run(script) if probes else script
        if own is not None:
            # A group, not a subshell: one fork fewer per task (read scripts keep the shell as
            # they found it: no exit, no cd, every variable set before it is read; see
            # modules/base.py).
            parts.append(f"{{ {own}\n}} 2>/dev/null; printf '\\n@@{token} {i} %d@@\\n' $?")
    return "\n".join(parts)


def _split_batch(stdout: str, scripts: list[str], token: str) -> list[CommandResult | None]:
    out: list[CommandResult | None] = []
    probes = probe.batched(scripts)
    answers, rest = probe.split_answers(stdout, probes, token) if probes else ({}, stdout)
    for i, script in enumerate(scripts):
        own = probe.left_to_run(script) if probes else script
        ran: CommandResult | None = None
        if own is not None:
            marker_start = f"\n@@{token} {i} "
            pos = rest.find(marker_start)
            end = rest.find("@@\n", pos + len(marker_start)) if pos >= 0 else -1
            if end >= 0:
                rc = int(rest[pos + len(marker_start) : end])
                ran = CommandResult(own, rc, rest[:pos], "")
                rest = rest[end + 3 :]
            else:  # this read's part is missing, and so is every later one's
                rest = ""
        out.append(probe.answer(script, ran, answers) if probes else ran)
    return out


class PlayReads:
    """The reads of one host's play that no write has outdated yet, by the task's position in
    the play (a write outdates every read taken before it; see the executor's docstring)."""

    def __init__(self, tasks: list[PlannedTask]) -> None:
        self.tasks = tasks
        self._at: dict[int, CommandResult | None] = {}

    def __contains__(self, position: object) -> bool:
        return position in self._at

    def __getitem__(self, position: int) -> CommandResult | None:
        return self._at[position]

    def replace(self, positions: list[int], results: list[CommandResult | None]) -> None:
        """Only these reads are current now (those taken before are outdated)."""
        self._at = dict(zip(positions, results, strict=True))

    def read(self, conn: Connection, positions: list[int]) -> None:
        """Read the tasks at ``positions`` in one round trip; only they are current then."""
        self.replace(positions, batch_read(conn, [self.tasks[i] for i in positions]))

    def clear(self) -> None:
        self._at = {}

    def upcoming(self, start: int, limit: int) -> list[int]:
        """Positions of up to ``limit`` module tasks from ``start`` on, stopping at a flush of
        handlers (the handlers may change what those tasks would read)."""
        out: list[int] = []
        for i in range(start, len(self.tasks)):
            if self.tasks[i].flush_handlers or len(out) >= limit:
                break
            out.append(i)
        return out
