"""The executor's guarantees, on real files of this machine through a local connection.

Check mode writes nothing, changed is computed from state, a second run changes nothing, handlers
run once in handler-file order, secrets stay masked, one host's fault leaves the others alone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from deployer.connection import CommandResult, LocalConnection, ScriptedConnection
from deployer.errors import HostUnreachable
from deployer.executor import Executor, batch_read
from deployer.modules.base import MODULES, Module, Param, parse_kv, q, run_checked
from deployer.plan import HostPlan, Planner
from deployer.results import Status
from deployer.roles import Play
from deployer.secrets import MASK

ROLES = Path(__file__).parent / "engine_roles" / "roles"
PLAY = Play(name="demo", hosts="all", roles=("demo",))


class FakeInventory:
    """The least an inventory must offer the planner: hosts, groups and resolved variables."""

    def __init__(self, per_host: dict[str, dict[str, Any]]) -> None:
        self.per_host = per_host
        self.hosts = dict.fromkeys(per_host)
        self.groups = {"all": None}

    def group_hosts(self, group: str) -> list[str]:
        return list(self.per_host)

    def resolve_vars(self, host: str, defaults: dict[str, Any]) -> dict[str, Any]:
        return {**defaults, **self.per_host[host]}


def plans_for(per_host: dict[str, dict[str, Any]], **planner_kw: Any) -> list[HostPlan]:
    planner = Planner(FakeInventory(per_host), [ROLES], None, **planner_kw)
    planner.load_roles((PLAY,))
    return [planner.plan_host(h, [PLAY]) for h in per_host]


def tree(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "dir"
        for p in sorted(root.rglob("*"))
    }


def run(plans: list[HostPlan], **kw: Any):
    return Executor(lambda h: LocalConnection(h), **kw).run(plans, (PLAY,))


@pytest.fixture
def host_vars(tmp_path: Path) -> dict[str, Any]:
    return {"base": str(tmp_path / "h1"), "names": ["a", "b"]}


def test_first_run_converges_and_second_run_reports_zero_changes(host_vars):
    first = run(plans_for({"h1": host_vars}))
    assert first.ok
    assert first.totals()["changed"] == 7  # dir, template, token, 2 texts, 2 handlers
    second = run(plans_for({"h1": host_vars}))
    assert second.totals()["changed"] == 0
    assert second.totals()["ok"] == 5
    conf = Path(host_vars["base"], "etc", "app.conf")
    assert conf.read_text() == "name=h1\nport=9100\n"
    assert oct(conf.stat().st_mode & 0o777) == "0o640"


def test_check_mode_writes_nothing_and_predicts_every_change(host_vars, tmp_path):
    before = tree(tmp_path)
    report = run(plans_for({"h1": host_vars}), check=True, diff=True)
    assert tree(tmp_path) == before
    statuses = [(t.task, t.status, t.predicted) for t in report.hosts["h1"].tasks]
    assert all(s == Status.CHANGED and predicted for _, s, predicted in statuses)
    assert report.check_mode and report.ok


def test_check_mode_after_converge_predicts_only_the_real_difference(host_vars):
    run(plans_for({"h1": host_vars}))
    Path(host_vars["base"], "etc", "a.txt").write_text("drifted\n")
    report = run(plans_for({"h1": host_vars}), check=True, diff=True)
    changed = [t for t in report.hosts["h1"].tasks if t.changed]
    assert [t.task for t in changed] == ["text files (a)"]
    assert changed[0].content_diff.before == "drifted\n"
    assert changed[0].content_diff.after == "a\n"
    assert Path(host_vars["base"], "etc", "a.txt").read_text() == "drifted\n"


def test_handlers_run_once_in_handler_file_order_after_the_roles(host_vars):
    report = run(plans_for({"h1": host_vars}))
    names = [t.task for t in report.hosts["h1"].tasks]
    assert names[-2:] == ["first handler", "second handler"]
    assert sum(t.handler for t in report.hosts["h1"].tasks) == 2


def test_handlers_do_not_run_when_nothing_notifying_changed(host_vars):
    run(plans_for({"h1": host_vars}))
    Path(host_vars["base"], "handled-first").unlink()
    report = run(plans_for({"h1": host_vars}))
    assert not Path(host_vars["base"], "handled-first").exists()
    assert not any(t.handler for t in report.hosts["h1"].tasks)


def test_secret_content_is_masked_in_diffs_and_differences(host_vars):
    report = run(plans_for({"h1": host_vars}), check=True, diff=True)
    token = next(t for t in report.hosts["h1"].tasks if t.task == "token")
    assert token.content_diff is not None and token.content_diff.after == MASK
    assert "s3cr3t" not in str(report.to_json())


def test_secret_file_is_written_0600(host_vars):
    run(plans_for({"h1": host_vars}))
    token = Path(host_vars["base"], "etc", "token")
    assert oct(token.stat().st_mode & 0o777) == "0o600"


def test_tags_select_only_tagged_tasks(host_vars):
    Path(host_vars["base"], "etc").mkdir(parents=True)
    report = run(plans_for({"h1": host_vars}, tags=frozenset({"texts"})))
    assert [t.task for t in report.hosts["h1"].tasks] == ["text files (a)", "text files (b)"]


def test_skip_tags_drop_tagged_tasks(host_vars):
    report = run(plans_for({"h1": host_vars}, skip_tags=frozenset({"texts"})))
    assert not any(t.task.startswith("text files") for t in report.hosts["h1"].tasks)


def test_when_true_includes_the_task(host_vars):
    report = run(plans_for({"h1": {**host_vars, "optional_enabled": True}}))
    assert "only when enabled" in [t.task for t in report.hosts["h1"].tasks]


def test_unreachable_host_is_reported_apart_and_others_finish(tmp_path):
    plans = plans_for(
        {
            "good": {"base": str(tmp_path / "good"), "names": ["a"]},
            "down": {"base": str(tmp_path / "down"), "names": ["a"]},
        }
    )

    def connector(host: str):
        if host == "down":
            raise HostUnreachable("down: cannot reach 10.0.0.9:22: timed out")
        return LocalConnection(host)

    report = Executor(connector).run(plans, (PLAY,))
    assert report.hosts["down"].unreachable
    assert report.hosts["down"].counts()["unreachable"] == 1
    assert not report.hosts["good"].failed and report.hosts["good"].unreachable is None
    assert Path(tmp_path / "good" / "etc" / "app.conf").exists()
    assert report.exit_code == 1


def test_write_that_does_not_reach_the_desired_state_fails_the_task(host_vars):
    # The host keeps answering "absent" whatever is written: the re-read must catch it.
    conn = ScriptedConnection(name="h1").on("exists=", 0, "exists=0\n")
    plans = plans_for({"h1": host_vars})
    report = Executor(lambda h: conn).run(plans, (PLAY,))
    first = report.hosts["h1"].tasks[0]
    assert first.status == Status.FAILED
    assert "still differs" in first.error
    assert report.hosts["h1"].failed
    assert len(report.hosts["h1"].tasks) == 1  # the host stops at its first failure


def test_failing_read_is_a_failure_without_earlier_change_and_predicted_after_one(host_vars):
    conn = ScriptedConnection(name="h1").on("exists=", 1, "", "stat: permission denied")
    plans = plans_for({"h1": host_vars})
    report = Executor(lambda h: conn, check=True).run(plans, (PLAY,))
    assert report.hosts["h1"].tasks[0].status == Status.FAILED


def test_batch_read_splits_results_per_task(host_vars):
    plan = plans_for({"h1": host_vars})[0]
    tasks = plan.plays[0].tasks
    results = batch_read(LocalConnection("h1"), tasks)
    assert len(results) == len(tasks)
    assert all(isinstance(r, CommandResult) and "exists=0" in r.stdout for r in results)


def test_flush_handlers_runs_notified_handlers_at_that_point(tmp_path):
    play = Play(name="flush", hosts="all", roles=("flushing",))
    planner = Planner(FakeInventory({"h1": {"base": str(tmp_path)}}), [ROLES], None)
    planner.load_roles((play,))
    report = Executor(lambda h: LocalConnection(h)).run([planner.plan_host("h1", [play])], (play,))
    assert [t.task for t in report.hosts["h1"].tasks] == [
        "config",
        "apply config",
        "after the flush",
    ]
    again = Executor(lambda h: LocalConnection(h)).run([planner.plan_host("h1", [play])], (play,))
    assert [t.task for t in again.hosts["h1"].tasks] == ["config", "after the flush"]
    assert again.totals()["changed"] == 0


def test_hostvars_render_in_the_other_hosts_own_scope(tmp_path):
    from deployer.templating import TemplatedVars

    planner = Planner(
        FakeInventory(
            {"a": {"me": "{{ inventory_hostname }}"}, "b": {"me": "{{ inventory_hostname }}"}}
        ),
        [ROLES],
        None,
    )
    variables = planner.host_vars("a", PLAY)
    assert isinstance(variables, TemplatedVars)
    assert variables["me"] == "a"
    assert variables["hostvars"]["b"]["me"] == "b"
    assert planner.renderer.evaluate("hostvars['b'].me", variables, "t", 1, "k") == "b"


class CountingConnection(LocalConnection):
    """A local connection that records every command it runs."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.commands: list[str] = []

    def run(self, command: str, **kw: Any) -> CommandResult:
        self.commands.append(command)
        return super().run(command, **kw)


def test_a_quiet_write_outdates_the_reads_of_later_tasks(tmp_path):
    play = Play(name="outdating", hosts="all", roles=("outdating",))
    planner = Planner(FakeInventory({"h1": {"base": str(tmp_path)}}), [ROLES], None)
    planner.load_roles((play,))
    plans = [planner.plan_host("h1", [play])]
    Executor(lambda h: LocalConnection(h)).run(plans, (play,))
    # Second run: "seed" exists when the play's batched read runs, then the quiet command removes
    # it; "seed again" must read again rather than trust the read from before the command.
    again = Executor(lambda h: LocalConnection(h)).run(plans, (play,))
    statuses = [t.status for t in again.hosts["h1"].tasks]
    assert statuses == [Status.OK, Status.OK, Status.CHANGED]
    assert (tmp_path / "seed").read_text() == "x\n"


def test_a_file_write_carries_the_read_that_proves_it_and_the_next_tasks_read(host_vars):
    conn = CountingConnection("h1")
    plans = plans_for({"h1": host_vars})
    report = Executor(lambda h: conn).run(plans, (PLAY,))
    assert report.ok
    changed = [t for t in report.hosts["h1"].tasks if t.status == Status.CHANGED and not t.handler]
    assert len(changed) >= 3
    # One round trip for the play's reads, then one per written file: the write, the read that
    # proves it and the next task's read; no task is read on its own.
    commands = [c for c in conn.commands if "/handled-" not in c]
    assert len(commands) == 1 + len(changed)
    assert all("exists=" in c for c in commands)


def test_a_failed_write_reports_its_own_error_and_reads_nothing_after_it(tmp_path):
    from deployer.executor import _HostState, _WriteSession

    plan = plans_for({"h1": {"base": str(tmp_path / "h1"), "names": []}})[0]
    conn = CountingConnection("h1")
    state = _HostState("h1", lambda h: conn)
    session = _WriteSession(state, plan.plays[0].tasks[:2])
    failed = session.run("echo partial; echo 'no space left' >&2; exit 3")
    assert (failed.rc, failed.stdout, failed.stderr) == (3, "partial\n", "no space left\n")
    assert session.reads is None
    ok = session.run("echo done")
    assert (ok.rc, ok.stdout) == (0, "done\n")
    assert session.reads is not None and len(session.reads) == 2
    assert all(r is not None and "exists=0" in r.stdout for r in session.reads)


class ReconnectModule(Module):
    """Test-only: touches a marker, then replaces the host's connection (like a reboot)."""

    name = "test_reconnect"
    params = {"path": Param(str, required=True)}

    def read_script(self, args: dict[str, Any]) -> str:
        return f"if [ -e {q(args['path'])} ]; then echo present=1; else echo present=0; fi"

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return {"present": parse_kv(result.stdout)["present"]}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"present": "1"}

    def write(self, session: Any, args: dict[str, Any], obs: Any) -> None:
        run_checked(session, f"touch -- {q(args['path'])}")
        session.reconnect(5.0)


class ClosingConnection(LocalConnection):
    """A local connection that refuses commands once closed, as a dead SSH connection does."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.is_closed = False

    def run(self, command: str, **kw: Any) -> CommandResult:
        if self.is_closed:
            raise HostUnreachable(f"{self.name}: connection lost")
        return super().run(command, **kw)

    def close(self) -> None:
        self.is_closed = True


@pytest.fixture
def reconnect_module():
    """The test-only module, registered for one test (the registry is the product's)."""
    MODULES[ReconnectModule.name] = ReconnectModule
    yield ReconnectModule
    del MODULES[ReconnectModule.name]


def test_tasks_after_a_reconnect_read_through_the_new_connection(tmp_path, reconnect_module):
    play = Play(name="reconnecting", hosts="all", roles=("reconnecting",))
    planner = Planner(FakeInventory({"h1": {"base": str(tmp_path)}}), [ROLES], None)
    planner.load_roles((play,))
    opened: list[ClosingConnection] = []

    def connect(host: str) -> ClosingConnection:
        opened.append(ClosingConnection(host))
        return opened[-1]

    report = Executor(connect).run([planner.plan_host("h1", [play])], (play,))
    assert report.hosts["h1"].unreachable is None
    assert [t.status for t in report.hosts["h1"].tasks] == [Status.CHANGED] * 3
    assert len(opened) == 2 and opened[0].is_closed
    assert (tmp_path / "more").read_text() == "more\n"
