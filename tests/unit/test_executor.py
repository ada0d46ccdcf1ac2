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
from deployer.executor import Executor
from deployer.hostsession import batch_read
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

    def layered_vars(self, host, defaults, overrides, hostvars) -> dict[str, Any]:
        return {
            **self.resolve_vars(host, defaults),
            **overrides,
            "inventory_hostname": host,
            "hostvars": hostvars,
        }


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
    # proves it and the next task's read; no task is read on its own. (Handlers' commands and the
    # clearing of their owed record after them are left out.)
    commands = [c for c in conn.commands if "/handled-" not in c and not c.startswith("rm -f -- ")]
    assert len(commands) == 1 + len(changed)
    assert all("stat --printf" in c for c in commands)  # each carries reads of files


def test_a_failed_write_reports_its_own_error_and_reads_nothing_after_it(tmp_path):
    from deployer.hostsession import HostState, WriteSession

    plan = plans_for({"h1": {"base": str(tmp_path / "h1"), "names": []}})[0]
    conn = CountingConnection("h1")
    state = HostState("h1", lambda h: conn)
    session = WriteSession(state, plan.plays[0].tasks[:2])
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


# ---- owed handlers: a handler a change notified survives the run that made the change --------

OWING = Play(name="owing", hosts="all", roles=("owing",))


def owing_plan(base: Path, rules: str, config: str) -> list[HostPlan]:
    planner = Planner(
        FakeInventory({"h1": {"base": str(base), "rules": rules, "config": config}}), [ROLES], None
    )
    planner.load_roles((OWING,))
    return [planner.plan_host("h1", [OWING])]


def run_owing(base: Path, rules: str, config: str, **kw: Any):
    return Executor(lambda h: LocalConnection(h), **kw).run(
        owing_plan(base, rules, config), (OWING,)
    )


def test_a_reload_owed_by_a_failed_run_runs_in_the_next_run_that_changes_nothing(tmp_path):
    assert run_owing(tmp_path, "v1", "good").ok
    assert (tmp_path / "loaded").read_text() == "v1\ngood\n"
    # A valid rule change and a config the validator refuses: the rules are written, the run
    # stops at the config, the reload never runs.
    failed = run_owing(tmp_path, "v2", "bad")
    assert not failed.ok
    assert (tmp_path / "rules").read_text() == "v2\n"
    assert (tmp_path / "loaded").read_text() == "v1\ngood\n"
    # The config fixed: nothing left to change, and the reload the rule change owes runs.
    fixed = run_owing(tmp_path, "v2", "good")
    assert fixed.ok
    assert [(t.task, t.status) for t in fixed.hosts["h1"].tasks] == [
        ("rules", Status.OK),
        ("config (validated)", Status.OK),
        ("reload", Status.CHANGED),
    ]
    assert (tmp_path / "loaded").read_text() == "v2\ngood\n"


def test_an_owed_handler_is_cleared_once_it_ran(tmp_path, owed_handlers_in_tmp):
    run_owing(tmp_path, "v1", "good")
    run_owing(tmp_path, "v2", "bad")
    assert list(owed_handlers_in_tmp.glob("*.owed"))
    run_owing(tmp_path, "v2", "good")
    assert not list(owed_handlers_in_tmp.glob("*.owed"))
    again = run_owing(tmp_path, "v2", "good")
    assert again.totals()["changed"] == 0
    assert not any(t.handler for t in again.hosts["h1"].tasks)


def test_the_owed_record_names_the_change_that_made_the_handler_owed(
    tmp_path, owed_handlers_in_tmp
):
    from deployer import owed

    run_owing(tmp_path, "v1", "good")
    run_owing(tmp_path, "v2", "bad")  # the rules made the reload owed; the config failed
    [entry] = owed.parse(
        "".join(f"@@owed\n{p.read_text()}" for p in owed_handlers_in_tmp.glob("*.owed"))
    ).values()
    assert (entry.role, entry.handler, entry.by) == ("owing", "reload", "rules")
    assert entry.since.endswith("Z")


def test_an_owed_handler_that_fails_stays_owed(tmp_path):
    run_owing(tmp_path, "v1", "good")
    (tmp_path / "refuse-reload").write_text("")
    assert not run_owing(tmp_path, "v2", "good").ok  # the rules changed, the reload failed
    assert not run_owing(tmp_path, "v2", "good").ok  # still owed, still failing
    (tmp_path / "refuse-reload").unlink()
    third = run_owing(tmp_path, "v2", "good")
    assert third.ok and (tmp_path / "loaded").read_text() == "v2\ngood\n"


def test_the_owed_record_is_on_the_host_before_the_change_so_a_lost_controller_keeps_it(
    tmp_path, owed_handlers_in_tmp
):
    run_owing(tmp_path, "v1", "good")

    class DiesAfterTheRuleWrite(LocalConnection):
        """The controller's link dies right after the command that writes the rules."""

        def run(self, command: str, **kw: Any) -> CommandResult:
            if getattr(self, "dead", False):
                raise HostUnreachable("h1: connection lost")
            result = super().run(command, **kw)
            if f"{tmp_path}/rules" in command and "mv -f" in command:
                self.dead = True
            return result

    lost = Executor(lambda h: DiesAfterTheRuleWrite(h)).run(
        owing_plan(tmp_path, "v2", "good"), (OWING,)
    )
    assert lost.hosts["h1"].unreachable
    assert (tmp_path / "rules").read_text() == "v2\n"
    assert len(list(owed_handlers_in_tmp.glob("*.owed"))) == 1
    nxt = run_owing(tmp_path, "v2", "good")
    assert (tmp_path / "loaded").read_text() == "v2\ngood\n"
    handler = nxt.hosts["h1"].tasks[-1]
    assert handler.handler and handler.owed_since  # reported as owed by an earlier run
    assert nxt.to_json()["hosts"]["h1"]["tasks"][-1]["owed_since"] == handler.owed_since


def test_a_failed_write_that_changed_nothing_owes_nothing(tmp_path, owed_handlers_in_tmp):
    run_owing(tmp_path, "v1", "good")
    assert not run_owing(tmp_path, "v1", "bad").ok  # refused by the validator: nothing written
    assert not list(owed_handlers_in_tmp.glob("*.owed"))
    assert run_owing(tmp_path, "v1", "good").totals()["changed"] == 0


def test_check_mode_predicts_an_owed_handler_and_records_nothing(tmp_path, owed_handlers_in_tmp):
    run_owing(tmp_path, "v1", "good")
    run_owing(tmp_path, "v2", "bad")
    owed_before = sorted(p.read_text() for p in owed_handlers_in_tmp.glob("*.owed"))
    report = run_owing(tmp_path, "v2", "good", check=True)
    assert [(t.task, t.status, t.predicted) for t in report.hosts["h1"].tasks] == [
        ("rules", Status.OK, False),
        ("config (validated)", Status.OK, False),
        ("reload", Status.CHANGED, True),
    ]
    assert sorted(p.read_text() for p in owed_handlers_in_tmp.glob("*.owed")) == owed_before
    assert (tmp_path / "loaded").read_text() == "v1\ngood\n"


def test_check_mode_writes_no_owed_record(tmp_path, owed_handlers_in_tmp):
    run_owing(tmp_path, "v2", "good", check=True)
    assert not owed_handlers_in_tmp.exists() or not list(owed_handlers_in_tmp.iterdir())


# ---- the HA invariant: a replica is not taken down while no other one serves ---------------

HA = Play(name="ha", hosts="all", roles=("ha",))


class ServiceModule(Module):
    """Test-only: a service whose "invocation" is a counter in a file; a restart bumps it.

    Judged as systemd_unit is: a restart is proven against the read before it, an owed
    restart by the baseline taken at the change."""

    name = "test_service"
    params = {"path": Param(str, required=True)}

    def read_script(self, args: dict[str, Any]) -> str:
        return f"printf 'invocation=%s\\n' \"$(cat {q(args['path'])} 2>/dev/null)\""

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return {"invocation": parse_kv(result.stdout).get("invocation", "")}

    def observe(self, args, result, *, before=None, baseline=None):
        from deployer.modules.base import Observation

        actual = self.parse(args, result)
        if before is not None:
            actual["restarted"] = actual["invocation"] != before.actual["invocation"]
        elif baseline is not None:
            actual["restarted"] = actual["invocation"] != baseline.strip()
        else:
            actual["restarted"] = False
        return Observation(actual, self.compare(args, actual))

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"restarted": True}

    def baseline_script(self, args: dict[str, Any]) -> str | None:
        return f"cat {q(args['path'])} 2>/dev/null"

    def takes_down(self, args: dict[str, Any], obs: Any) -> str | None:
        return "restart of the test service" if obs.actual["invocation"] else None

    def write(self, session: Any, args: dict[str, Any], obs: Any) -> None:
        p = q(args["path"])
        run_checked(session, f"echo $(( $(cat {p} 2>/dev/null || echo 0) + 1 )) > {p}")


@pytest.fixture
def service_module():
    MODULES[ServiceModule.name] = ServiceModule
    yield ServiceModule
    del MODULES[ServiceModule.name]


class Peer:
    """A peer replica's readiness endpoint on this machine, answering ``status``."""

    def __init__(self, status: int) -> None:
        import http.server
        import threading

        answer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(answer.status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.status = status
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/-/ready"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def peers():
    made: list[Peer] = []

    def make(status: int) -> Peer:
        made.append(Peer(status))
        return made[-1]

    yield make
    for p in made:
        p.close()


def closed_url() -> str:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/-/ready"


def ha_run(base: Path, flags: str, peer_urls: dict[str, str], **kw: Any):
    hosts = {"h1": {"base": str(base), "flags": flags, "peers": ["h1", *peer_urls]}}
    hosts["h1"]["peer_urls"] = peer_urls
    inventory = FakeInventory({**hosts, **{p: {} for p in peer_urls}})
    planner = Planner(inventory, [ROLES], None)
    planner.load_roles((HA,))
    plans = [planner.plan_host("h1", [HA])]
    return Executor(lambda h: LocalConnection(h), **kw).run(plans, (HA,))


def running_service(base: Path) -> None:
    base.mkdir(parents=True, exist_ok=True)
    (base / "flags").write_text("old\n")
    (base / "invocation").write_text("1\n")


def test_a_change_that_would_restart_the_last_serving_replica_is_refused_untouched(
    tmp_path, service_module
):
    running_service(tmp_path)
    report = ha_run(tmp_path, "new", {"peer1": closed_url()})
    task = report.hosts["h1"].tasks[0]
    assert (task.task, task.status) == ("flags", Status.FAILED)
    assert "refused on h1" in task.error and "peer1" in task.error
    assert "connection refused" in task.error and "--allow-ha-degraded" in task.error
    assert "nothing was changed on h1" in task.error
    assert (tmp_path / "flags").read_text() == "old\n"  # the change was not made
    assert (tmp_path / "invocation").read_text() == "1\n"  # nor the restart


def test_a_restart_goes_ahead_while_its_peer_serves(tmp_path, service_module, peers):
    running_service(tmp_path)
    report = ha_run(tmp_path, "new", {"peer1": peers(200).url})
    assert report.ok
    assert [t.task for t in report.hosts["h1"].tasks] == ["flags", "restart"]
    assert (tmp_path / "invocation").read_text() == "2\n"


def test_one_serving_peer_of_two_is_enough(tmp_path, service_module, peers):
    running_service(tmp_path)
    report = ha_run(tmp_path, "new", {"peer1": closed_url(), "peer2": peers(200).url})
    assert report.ok and (tmp_path / "invocation").read_text() == "2\n"


def test_a_peer_that_answers_not_ready_counts_as_not_serving(tmp_path, service_module, peers):
    running_service(tmp_path)
    report = ha_run(tmp_path, "new", {"peer1": peers(503).url})
    assert "HTTP 503" in report.hosts["h1"].tasks[0].error
    assert (tmp_path / "flags").read_text() == "old\n"


def test_allow_ha_degraded_restarts_anyway(tmp_path, service_module):
    running_service(tmp_path)
    report = ha_run(tmp_path, "new", {"peer1": closed_url()}, allow_ha_degraded=True)
    assert report.ok and (tmp_path / "invocation").read_text() == "2\n"


def test_a_replica_that_is_not_running_is_started_whatever_its_peers(tmp_path, service_module):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "invocation").write_text("")  # not running: starting it takes nothing down
    report = ha_run(tmp_path, "new", {"peer1": closed_url()})
    assert report.ok and (tmp_path / "invocation").read_text() == "1\n"


def test_check_mode_predicts_the_refusal(tmp_path, service_module):
    running_service(tmp_path)
    report = ha_run(tmp_path, "new", {"peer1": closed_url()}, check=True)
    assert report.hosts["h1"].tasks[0].status == Status.FAILED
    assert (tmp_path / "flags").read_text() == "old\n"


def lose_controller_after_the_flags_write(base: Path, peer_urls: dict[str, str]) -> None:
    """A run whose link dies right after it wrote the flags: the restart stays owed."""

    class DiesAfterTheFlagsWrite(LocalConnection):
        def run(self, command: str, **kw: Any) -> CommandResult:
            if getattr(self, "dead", False):
                raise HostUnreachable("h1: connection lost")
            result = super().run(command, **kw)
            if f"{base}/flags" in command and "mv -f" in command:
                self.dead = True
            return result

    hosts = {"h1": {"base": str(base), "flags": "new", "peers": list(peer_urls)}}
    hosts["h1"]["peer_urls"] = peer_urls
    planner = Planner(FakeInventory({**hosts, **{p: {} for p in peer_urls}}), [ROLES], None)
    planner.load_roles((HA,))
    report = Executor(lambda h: DiesAfterTheFlagsWrite(h)).run(
        [planner.plan_host("h1", [HA])], (HA,)
    )
    assert report.hosts["h1"].unreachable and (base / "flags").read_text() == "new\n"


def test_an_owed_restart_is_refused_while_no_peer_serves_and_runs_once_one_does(
    tmp_path, service_module, peers
):
    running_service(tmp_path)
    peer = peers(200)
    lose_controller_after_the_flags_write(tmp_path, {"peer1": peer.url})
    peer.status = 503
    refused = ha_run(tmp_path, "new", {"peer1": peer.url})
    restart = refused.hosts["h1"].tasks[-1]
    assert (restart.task, restart.status) == ("restart", Status.FAILED)
    assert "refused on h1" in restart.error
    assert (tmp_path / "invocation").read_text() == "1\n"
    peer.status = 200
    ok = ha_run(tmp_path, "new", {"peer1": peer.url})
    assert ok.ok and (tmp_path / "invocation").read_text() == "2\n"


def test_an_owed_restart_done_meanwhile_is_not_repeated(tmp_path, service_module, peers):
    running_service(tmp_path)
    peer = peers(200)
    lose_controller_after_the_flags_write(tmp_path, {"peer1": peer.url})
    (tmp_path / "invocation").write_text("7\n")  # restarted by someone else meanwhile
    report = ha_run(tmp_path, "new", {"peer1": peer.url})
    restart = report.hosts["h1"].tasks[-1]
    assert (restart.task, restart.status) == ("restart", Status.OK)
    assert (tmp_path / "invocation").read_text() == "7\n"


# ---- check mode: a read-only task never predicts a change -----------------------------------


def test_check_mode_predicts_no_change_for_waits_and_quiet_commands(tmp_path):
    import socket

    play = Play(name="verifying", hosts="all", roles=("verifying",))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens: the real run would wait for it
    planner = Planner(FakeInventory({"h1": {"base": str(tmp_path), "port": port}}), [ROLES], None)
    planner.load_roles((play,))
    report = Executor(lambda h: LocalConnection(h), check=True).run(
        [planner.plan_host("h1", [play])], (play,)
    )
    assert [(t.task, t.status, t.predicted) for t in report.hosts["h1"].tasks] == [
        ("a file", Status.CHANGED, True),
        ("the service answers", Status.OK, False),
        ("a quiet command", Status.OK, False),
    ]
    assert report.totals()["changed"] == 1


def test_a_failed_unguarded_command_keeps_the_handlers_it_made_owed(tmp_path, owed_handlers_in_tmp):
    # It may have changed something before it failed: no read can tell, so the handler stays owed.
    play = Play(name="cmd", hosts="all", roles=("failing_command",))
    role = tmp_path / "roles" / "failing_command"
    (role / "tasks").mkdir(parents=True)
    (role / "handlers").mkdir()
    (role / "tasks" / "main.yml").write_text(
        "- name: half a migration\n  command:\n    cmd: 'touch "
        f"{tmp_path}/half; false'\n    changed_when: true\n  notify: after\n"
    )
    (role / "handlers" / "main.yml").write_text(
        f"- name: after\n  command:\n    cmd: 'touch {tmp_path}/after'\n    changed_when: true\n"
    )
    planner = Planner(FakeInventory({"h1": {}}), [tmp_path / "roles"], None)
    planner.load_roles((play,))
    report = Executor(lambda h: LocalConnection(h)).run([planner.plan_host("h1", [play])], (play,))
    assert report.hosts["h1"].failed and (tmp_path / "half").exists()
    assert len(list(owed_handlers_in_tmp.glob("*.owed"))) == 1
