"""A host's facts and its first play's batched read go out in one round trip: a no-op ``up``
costs one command per host (one play), in check mode too; the executor uses the read taken with
the facts only where the plan built with the facts reads exactly the same scripts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer import owed
from deployer.connection import CommandResult, ConnectionPool, LocalConnection
from deployer.executor import Executor
from deployer.hostsession import Prefetched, first_read_scripts
from deployer.session import DeploySession, RunOptions
from tests.unit.test_executor import PLAY, ROLES, plans_for

HOSTS = ("h1", "h2")


class CountingConnection(LocalConnection):
    def __init__(self, name: str, log: dict[str, list[str]]) -> None:
        super().__init__(name)
        self.log = log

    def run(self, command: str, **kw: Any) -> CommandResult:
        self.log.setdefault(self.name, []).append(command)
        return super().run(command, **kw)


def _session(tmp_path: Path, log: dict[str, list[str]]) -> DeploySession:
    inventory = tmp_path / "inventory.yml"
    hosts = "".join(f"    {h}: {{base: {tmp_path / h}, names: [a, b]}}\n" for h in HOSTS)
    inventory.write_text(f"all:\n  hosts:\n{hosts}")
    site = tmp_path / "site.yml"
    site.write_text("- name: demo\n  hosts: all\n  roles: [demo]\n")
    session = DeploySession.load(RunOptions(inventory=inventory, site=site, roles_path=[ROLES]))
    session.pool = ConnectionPool(lambda h: CountingConnection(h, log))
    return session


def test_a_no_op_up_is_one_round_trip_per_host(tmp_path):
    _session(tmp_path, {}).converge(check=False, diff=False)  # converge first
    log: dict[str, list[str]] = {}
    report = _session(tmp_path, log).converge(check=False, diff=False)
    assert report.totals()["changed"] == 0
    assert {h: len(commands) for h, commands in log.items()} == dict.fromkeys(HOSTS, 1)


def test_a_no_op_up_in_check_mode_is_one_round_trip_per_host(tmp_path):
    _session(tmp_path, {}).converge(check=False, diff=False)
    log: dict[str, list[str]] = {}
    report = _session(tmp_path, log).converge(check=True, diff=False)
    assert report.totals()["changed"] == 0
    assert {h: len(commands) for h, commands in log.items()} == dict.fromkeys(HOSTS, 1)


def test_a_sessions_first_reads_and_its_executor_share_one_owed_dir(tmp_path):
    elsewhere = str(tmp_path / "owed-elsewhere")
    first = _session(tmp_path, {})
    first.owed_dir = elsewhere
    first.converge(check=False, diff=False)
    log: dict[str, list[str]] = {}
    again = _session(tmp_path, log)
    again.owed_dir = elsewhere
    report = again.converge(check=False, diff=False)
    assert report.totals()["changed"] == 0
    assert {h: len(commands) for h, commands in log.items()} == dict.fromkeys(HOSTS, 1)
    assert all(elsewhere in commands[0] for commands in log.values())


def test_a_cold_up_still_reads_its_facts_and_first_play_together(tmp_path):
    log: dict[str, list[str]] = {}
    report = _session(tmp_path, log).converge(check=False, diff=False)
    assert report.totals()["changed"] > 0
    for h in HOSTS:
        assert "@@os" in log[h][0] and "@@" in log[h][0].split("@@os", 1)[1]
        assert not any("@@os" in c for c in log[h][1:])  # facts read once


def _executor_commands(tmp_path, prefetched) -> list[str]:
    log: dict[str, list[str]] = {}
    plans = plans_for({"h1": {"base": str(tmp_path), "names": ["a"]}})
    Executor(lambda h: CountingConnection(h, log), prefetched=prefetched).run(plans, (PLAY,))
    return log.get("h1", [])


def test_the_executor_uses_a_prefetched_read_of_exactly_its_first_read(tmp_path):
    plans = plans_for({"h1": {"base": str(tmp_path), "names": ["a"]}})
    Executor(lambda h: LocalConnection(h)).run(plans, (PLAY,))  # converge first
    _, scripts = first_read_scripts(plans[0].plays[0], owed.OWED_DIR)
    from deployer.hostsession import batch_run

    results = batch_run(LocalConnection("h1"), scripts)
    pre = {"h1": Prefetched(tuple(scripts), tuple(results))}
    assert _executor_commands(tmp_path, pre) == []  # no-op: nothing more to read


def test_the_executor_reads_itself_when_the_prefetched_scripts_differ(tmp_path):
    plans = plans_for({"h1": {"base": str(tmp_path), "names": ["a"]}})
    Executor(lambda h: LocalConnection(h)).run(plans, (PLAY,))
    stale = {"h1": Prefetched(("true",), (None,))}
    commands = _executor_commands(tmp_path, stale)
    assert len(commands) == 1  # its own batched read, and nothing to change


def test_the_executor_names_the_hosts_whose_prefetched_read_it_could_not_use(tmp_path):
    plans = plans_for({"h1": {"base": str(tmp_path), "names": ["a"]}})
    executor = Executor(
        lambda h: LocalConnection(h), prefetched={"h1": Prefetched(("true",), (None,))}
    )
    executor.run(plans, (PLAY,))
    assert executor.prefetch_unused == ["h1"]


class ClosingConnection(LocalConnection):
    opened: list[str] = []

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.closed = False
        ClosingConnection.opened.append(name)

    def close(self) -> None:
        self.closed = True


def test_converging_hosts_twice_on_a_session_reuses_its_connections(tmp_path):
    # The rollout converges each host twice (installing, starting) and then validates it over
    # the same pool: each converge used to close the pooled connection, and every step after
    # it paid a new SSH handshake.
    session = _session(tmp_path, {})
    ClosingConnection.opened = []
    session.pool = ConnectionPool(ClosingConnection)
    for _ in range(2):
        session.converge_hosts(list(HOSTS), session.plays)
    assert sorted(ClosingConnection.opened) == sorted(HOSTS)
    assert not any(c.closed for c in session.pool._conns.values())


def test_a_cut_facts_read_is_read_again_alone_and_the_reads_after_it_are_not_trusted():
    from deployer.session import gather_with_reads

    class Cut(LocalConnection):
        """The first command stops after the facts' first section (a fork failure, say)."""

        calls = 0

        def run(self, command: str, **kw: Any) -> CommandResult:
            Cut.calls += 1
            got = super().run(command, **kw)
            if Cut.calls == 1:
                head = got.stdout[: got.stdout.index("@@pci")]
                return CommandResult(command, 1, head, "fork: retry\n")
            return got

    facts, reads = gather_with_reads(Cut("gpu01"), ["echo one", "echo two"])
    assert Cut.calls == 2 and facts.arch and reads == [None, None]


class SudoRefused(LocalConnection):
    """A host whose sudo refuses every command (no rule in sudoers for the user)."""

    def run(self, command: str, **kw: Any) -> CommandResult:
        return CommandResult(command, 1, "", "sudo: a password is required\n")


def test_a_host_whose_facts_cannot_be_read_fails_alone_and_the_others_converge(tmp_path):
    # It is not unreachable (it answered), and not a host without an OS whose plan fails on a
    # template far from the cause and stops the whole run: it fails, with what the host said.
    session = _session(tmp_path, {})
    session.pool = ConnectionPool(lambda h: SudoRefused(h) if h == "h2" else LocalConnection(h))
    report = session.converge(check=False, diff=False)
    assert not report.ok
    h2 = report.hosts["h2"]
    assert h2.failed and not h2.unreachable
    assert [(t.task, t.status.value) for t in h2.tasks] == [("facts", "failed")]
    assert "sudo: a password is required" in (h2.tasks[0].error or "")
    assert report.hosts["h1"].counts()["changed"] > 0 and not report.hosts["h1"].failed
    assert session.unread == {"h2": h2.tasks[0].error} and not session.unreachable


def test_converging_hosts_again_reports_a_host_whose_facts_cannot_be_read_failed(tmp_path):
    session = _session(tmp_path, {})
    session.pool = ConnectionPool(lambda h: SudoRefused(h) if h == "h2" else LocalConnection(h))
    report = session.converge_hosts(list(HOSTS), session.plays)
    assert report.hosts["h2"].failed and report.hosts["h2"].tasks[0].task == "facts"
    assert not report.hosts["h1"].failed
