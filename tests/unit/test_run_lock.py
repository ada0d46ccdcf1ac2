"""One changing run per inventory on a controller (deployer/run_lock.py): a second ``up``,
``upgrade-driver``, ``restore`` or ``targets`` against the same inventory is refused at once, naming the run
that holds it; read-only commands are never refused; the lock dies with its holder."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from deployer import cli, run_lock
from deployer.errors import InputError
from deployer.results import RunReport


@pytest.fixture(autouse=True)
def _locks_here(tmp_path, monkeypatch):
    monkeypatch.setenv(run_lock.LOCK_DIR_ENV, str(tmp_path / "locks"))


def test_a_second_run_is_refused_naming_the_first(tmp_path):
    inv = tmp_path / "inventory.yml"
    with (
        run_lock.changing(inv, "up"),
        pytest.raises(InputError) as refused,
        run_lock.changing(inv, "upgrade-driver"),
    ):
        pass
    said = str(refused.value)
    assert f"up, pid {os.getpid()}, since " in said and "let it finish" in said
    assert str(run_lock.lock_path(inv)) in said and refused.value.source == str(inv)
    with run_lock.changing(inv, "up"):  # released: the next run goes on
        pass


def test_the_lock_is_private_and_names_the_inventory_by_its_real_path(tmp_path):
    inv = tmp_path / "inventory.yml"
    inv.write_text("all: {}\n")
    (tmp_path / "link.yml").symlink_to(inv)
    assert run_lock.lock_path(tmp_path / "link.yml") == run_lock.lock_path(inv)
    assert run_lock.lock_path(tmp_path / "other.yml") != run_lock.lock_path(inv)
    with run_lock.changing(inv, "up"):
        path = run_lock.lock_path(inv)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == ""  # no holder named once it ended


HOLD = """
import sys, time
from deployer import run_lock
with run_lock.changing(sys.argv[1], "up"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    inv = tmp_path / "inventory.yml"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(inv)], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(InputError, match=f"pid {holder.pid}"), run_lock.changing(inv, "up"):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    with run_lock.changing(inv, "up"):
        pass


def test_who_holds_the_lock_is_read_without_taking_it(tmp_path):
    # status reads it (a re-shard under way): in /proc/locks, so a run starting at that moment
    # is never turned away
    inv = tmp_path / "inventory.yml"
    assert run_lock.holder(inv) is None  # no lock file yet
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(inv)], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        said = run_lock.holder(inv)
        assert said is not None and said.startswith(f"up, pid {holder.pid}, since ")
        no_proc = tmp_path / "no-proc-locks"  # without /proc/locks: the pid it wrote, alive
        assert run_lock.holder(inv, locks=no_proc) == said
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert run_lock.holder(inv) is None  # the kernel dropped it with its holder
    assert run_lock.holder(inv, locks=no_proc) is None  # its text is left, its pid is gone
    with run_lock.changing(inv, "up"):  # never taken by reading it
        assert run_lock.holder(inv) == run_lock.lock_path(inv).read_text().strip()
    assert run_lock.holder(inv) is None and run_lock.holder(inv, locks=no_proc) is None


class Loaded(Exception):
    """The run got as far as loading the inventory."""


def refuse_load(options):
    raise Loaded


def test_up_is_refused_with_exit_2_before_it_loads_anything(tmp_path, monkeypatch):
    inv = tmp_path / "inventory.yml"
    monkeypatch.setattr(cli.DeploySession, "load", refuse_load)
    with run_lock.changing(inv, "upgrade-driver"):
        result = CliRunner().invoke(cli.cli, ["up", "-i", str(inv)])
        assert result.exit_code == 2, result.output
        assert "another gpumon-deploy run is changing the hosts" in result.output
        assert "upgrade-driver, pid" in result.output and not isinstance(result.exception, Loaded)


def test_a_check_is_never_refused(tmp_path, monkeypatch):
    inv = tmp_path / "inventory.yml"

    class Session:
        def converge(self, **_: object) -> RunReport:
            return RunReport(check_mode=True)

    monkeypatch.setattr(cli.DeploySession, "load", lambda options: Session())
    with run_lock.changing(inv, "up"):
        result = CliRunner().invoke(cli.cli, ["up", "-i", str(inv), "--check"])
    assert result.exit_code == 0, result.output


def test_upgrade_driver_is_refused_while_an_up_runs(tmp_path, monkeypatch):
    from deployer.rollout import command

    inv = tmp_path / "inventory.yml"
    started = []
    monkeypatch.setattr(command, "upgrade_driver", lambda req: started.append(req) or 0)
    with run_lock.changing(inv, "up"):
        result = CliRunner().invoke(cli.cli, ["upgrade-driver", "-i", str(inv), "--to", "580"])
        assert result.exit_code == 2 and "up, pid" in result.output and started == []
        checked = CliRunner().invoke(
            cli.cli, ["upgrade-driver", "-i", str(inv), "--to", "580", "--check"]
        )
        assert checked.exit_code == 0 and len(started) == 1
    # released at the block's end
    assert CliRunner().invoke(cli.cli, ["upgrade-driver", "-i", str(inv)]).exit_code == 0


def test_the_lock_directory_defaults_to_the_products_state(monkeypatch, tmp_path):
    monkeypatch.delenv(run_lock.LOCK_DIR_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert run_lock.lock_dir() == Path(tmp_path / "state" / "gpumon-deploy" / "locks")


def test_restore_is_refused_before_it_touches_the_store(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from deployer import restore

    inv = tmp_path / "inventory.yml"
    ran = []
    session = SimpleNamespace(pool=SimpleNamespace(get=ran.append, close_all=lambda: None))
    monkeypatch.setattr(restore, "store_variables", lambda i, e: (session, {"mon01": {}}))
    plan = SimpleNamespace(steps=[], source="s3://b/p", data_dir="/var/lib/vm")
    monkeypatch.setattr(restore, "plan", lambda host, v, source: plan)
    monkeypatch.setattr(restore, "execute", lambda *a: ran.append("execute") or [])
    with run_lock.changing(inv, "up"):
        result = CliRunner().invoke(cli.cli, ["restore", "-i", str(inv), "--yes"])
    assert result.exit_code == 2 and "up, pid" in result.output and ran == []


def test_targets_is_refused_while_an_up_runs_before_it_loads_anything(tmp_path, monkeypatch):
    # targets writes the replicas' targets files, which a running up (mid re-shard) owns
    from deployer.monitoring import targets

    inv = tmp_path / "inventory.yml"
    loaded = []
    monkeypatch.setattr(targets, "load_session", loaded.append)
    monkeypatch.setattr(targets, "push_targets", lambda s, **_: RunReport())
    with run_lock.changing(inv, "up"):
        result = CliRunner().invoke(cli.cli, ["targets", "-i", str(inv)])
        assert result.exit_code == 2 and "up, pid" in result.output and loaded == []
    assert CliRunner().invoke(cli.cli, ["targets", "-i", str(inv)]).exit_code == 0
    assert len(loaded) == 1
