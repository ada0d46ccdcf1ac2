"""The ``gpumon-deploy`` command line: a thin click group over the engine.

Exit status: 0 nothing failed; 1 a host failed or was unreachable; 2 invalid input or a refused
plan, in which case nothing was changed (no host was contacted, or, for a refusal that needs the
hosts' facts -- a loaded driver ``up`` would change -- the hosts were only read). Every error it
prints is masked (deployer/secrets.py); the libraries' logging shows only with -v
(deployer/library_logs.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from deployer import __version__, library_logs, run_lock
from deployer.errors import InputError
from deployer.facts import HostFacts
from deployer.gpu import preflight
from deployer.inventory import group_map
from deployer.monitoring import handoff
from deployer.report import write_json
from deployer.results import RunReport
from deployer.rollout.options import RolloutOptions
from deployer.secrets import mask_text
from deployer.session import INVENTORY_WARNINGS, DeploySession, RunOptions
from deployer.tls import material as tls_material
from deployer.tls import rotation

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


def _fail_input(exc: InputError) -> None:
    click.echo(f"error: {exc}", err=True)
    if getattr(exc, "hosts_read", False):  # refused on the hosts' facts (deployer/gpu/preflight.py)
        click.echo("nothing was changed; the hosts were only read", err=True)
    else:
        click.echo("nothing was changed; no host was contacted", err=True)
    sys.exit(EXIT_INPUT)


def out_of_service_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--out-of-service",
        "out_of_service",
        is_flag=True,
        help="The selected GPU hosts run no GPU work (drained): a planned driver may replace a "
        "loaded one in place. Without it a loaded driver changes only through upgrade-driver.",
    )(f)


def _more_verbose(ctx: click.Context, param: click.Parameter, count: int) -> None:
    # -v before the command (the group's) resets the level; -v after it adds to it.
    base = 0 if ctx.parent is None else library_logs.verbosity()
    library_logs.set_verbosity(base + count)


def verbose_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-v",
        "--verbose",
        count=True,
        expose_value=False,
        callback=_more_verbose,
        help="Show the libraries' log (SSH details) on stderr: -v warnings and errors, "
        "-vv info, -vvv debug.",
    )(f)


def _group_flags(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    try:
        return group_map.parse_flags(value)
    except InputError as exc:
        raise click.BadParameter(exc.message) from exc


def inventory_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """-i, --limit, -e, --group and -v: shared by every command that reads an inventory.
    ``--group`` reaches the inventory as the variable ``gpumon_groups``, above every ``-e``."""

    command = f

    @functools.wraps(command)
    def with_groups(*args: Any, group: dict[str, list[str]], **kwargs: Any) -> Any:
        if group:
            mapping = json.dumps({group_map.VAR: group})
            kwargs["extra_vars"] = (*kwargs.get("extra_vars", ()), mapping)
        return command(*args, **kwargs)

    f = verbose_option(with_groups)
    f = click.option(
        "--group",
        "group",
        multiple=True,
        metavar="PRODUCT=GROUP[,GROUP]",
        callback=_group_flags,
        help="Map one of the product's groups (gpu, prometheus, alertmanager, ...) onto the "
        "inventory's groups for this run (gpumon_groups); repeatable.",
    )(f)
    f = click.option(
        "-e",
        "--extra-vars",
        "extra_vars",
        multiple=True,
        metavar="KEY=VALUE|@FILE|JSON",
        help="Extra variables (highest precedence); repeatable.",
    )(f)
    f = click.option(
        "-l", "--limit", default=None, help="Host pattern, as in Ansible (a,b  g*  !x  &y)."
    )(f)
    f = click.option(
        "-i",
        "--inventory",
        "inventory",
        required=True,
        type=click.Path(path_type=Path),
        help="Inventory file or directory (Ansible YAML or INI).",
    )(f)
    return f


def output_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
    )(f)


def _say_once() -> Callable[[str], None]:
    """Says each inventory warning on stderr, masked, once per command (``up`` may load twice)."""
    said: set[str] = set()

    def say(text: str) -> None:
        if text not in said:
            said.add(text)
            click.echo(f"WARNING {mask_text(text)}", err=True)

    return say


def input_errors_exit_2(f: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input: its error and exit status 2. The inventory's warnings: on stderr."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        said = INVENTORY_WARNINGS.set(_say_once())
        try:
            return f(*args, **kwargs)
        except InputError as exc:
            _fail_input(exc)
        finally:
            INVENTORY_WARNINGS.reset(said)

    return wrapper


class _Commands(click.Group):
    """The top-level commands; ``lab`` (the lab package: its simulator, topologies and mirror) is
    imported only when it is run or listed, not by every ``up``: it was an eighth of start-up."""

    LAZY = {"lab": ("deployer.lab.cli", "lab")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            _register_subcommands()
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpumon-deploy")
@verbose_option
def cli() -> None:
    """Deploy and operate the monitoring stack of bare-metal GPU clusters."""


def converge_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--site",
        type=click.Path(path_type=Path),
        default=None,
        help="Site file (plays); default: the product's site.yml.",
    )(f)
    f = click.option(
        "--roles-path",
        "roles_path",
        multiple=True,
        type=click.Path(path_type=Path),
        help="Extra role directories searched first.",
    )(f)
    f = click.option(
        "--forks",
        type=click.IntRange(1, 1000),
        default=50,
        show_default=True,
        help="Hosts converged in parallel.",
    )(f)
    f = click.option(
        "--diff", is_flag=True, help="Show unified diffs of files and changed attributes."
    )(f)
    f = click.option("--skip-tags", default="", help="Comma-separated tags to skip.")(f)
    f = click.option("--tags", default="", help="Comma-separated tags to run (plus 'always').")(f)
    return f


def _tags(text: str) -> frozenset[str]:
    return frozenset(t.strip() for t in text.split(",") if t.strip())


@cli.command()
@inventory_options
@converge_options
@click.option("--check", "check_mode", is_flag=True, help="Predict changes; write nothing.")
@out_of_service_option
@click.option(
    "--allow-ha-degraded",
    is_flag=True,
    help="Restart a replica even when no other replica of its HA set serves.",
)
@output_option
@input_errors_exit_2
def up(
    inventory: Path,
    limit: str | None,
    extra_vars: tuple[str, ...],
    tags: str,
    skip_tags: str,
    diff: bool,
    forks: int,
    roles_path: tuple[Path, ...],
    site: Path | None,
    check_mode: bool,
    out_of_service: bool,
    allow_ha_degraded: bool,
    output: str,
) -> None:
    """Converge every selected host to the state its roles describe (a loaded NVIDIA driver is
    never changed: see upgrade-driver and --out-of-service)."""
    options = RunOptions(
        inventory=inventory,
        limit=limit,
        extra_vars=list(extra_vars),
        tags=_tags(tags),
        skip_tags=_tags(skip_tags),
        site=site,
        roles_path=list(roles_path),
    )
    partial = [flag for flag, given in (("--limit", limit is not None), ("--tags", tags),
                                        ("--skip-tags", skip_tags)) if given]  # fmt: skip
    whole = not partial and not check_mode
    # the lock says whether this up hands a re-shard over (status names it: checks_shards)
    label = f"up with {' '.join(partial)}" if partial else "up"
    with contextlib.nullcontext() if check_mode else run_lock.changing(inventory, label):
        reports = _up_passes(options, whole, check_mode, diff, forks, out_of_service,
                             allow_ha_degraded)  # fmt: skip
    report = RunReport.merged(reports)
    if output == "json":
        write_json(report, sys.stdout)
    sys.exit(report.exit_code)


def _up_passes(options: RunOptions, whole: bool, check_mode: bool, diff: bool, forks: int,
               out_of_service: bool, allow_ha_degraded: bool) -> list[RunReport]:  # fmt: skip
    """``up``'s passes: one, or one per step of a rotation or re-shard under way."""
    reports = []
    # A rotation of gpumon_tls' credential or CA (deployer/tls/rotation.py) takes one pass per
    # step, a re-shard (deployer/monitoring/handoff.py) one more: each pass begun only after the
    # pass before converged every host.
    for _ in range(2 + len(rotation.STEPS)):
        handoff.forget()
        report = DeploySession.load(options).converge(
            check=check_mode,
            diff=diff,
            forks=forks,
            out_of_service=out_of_service,
            allow_ha_degraded=allow_ha_degraded,
        )
        reports.append(report)
        settled = whole and report.ok
        handed_over = handoff.handing_over()
        wait_s = handoff.hand_over_wait_s()
        if settled and handed_over and not check_mode:
            print("NOTE re-shard: each replica scrapes its new hosts and keeps those it had; "
                  f"waiting {wait_s:.0f}s (the longest scrape interval) before the old owners let "
                  "go", file=sys.stderr)  # fmt: skip
            time.sleep(wait_s)
        if settled:
            handoff.settle()
        elif handed_over:
            print("NOTE re-shard: the replicas keep the hosts they had beside their new ones "
                  "until an up of every host (no --limit, --tags or --check) fails nowhere",
                  file=sys.stderr)  # fmt: skip
        under_way = [d for d in rotation.directories() if rotation.step_of(d) != rotation.SETTLED]
        if not settled:
            for d in under_way:
                print(f"NOTE gpumon_tls: the rotation in {d} stays at step "
                      f"{rotation.step_of(d)!r}; it moves on with an up of every host "
                      "(no --limit, --tags or --check) that fails nowhere", file=sys.stderr)  # fmt: skip
            break
        for d in under_way:
            print(f"NOTE gpumon_tls: rotation in {d}: step {rotation.step_of(d)!r} done "
                  f"on every host, now {rotation.advance(d)!r}", file=sys.stderr)  # fmt: skip
        if handed_over:
            print("NOTE re-shard: every replica scrapes the new layout's hosts; now the old "
                  "owners let go of the hosts that moved", file=sys.stderr)  # fmt: skip
        tls_material.forget()
        rotating = any(rotation.step_of(d) != rotation.SETTLED for d in under_way)
        if not rotating and not handed_over:
            break
    return reports


@cli.command()
@inventory_options
@click.option(
    "--offline",
    is_flag=True,
    help="Use the inventory's gpu_model instead of reading GPUs from the hosts.",
)
@out_of_service_option
@output_option
@input_errors_exit_2
def check(
    inventory: Path,
    limit: str | None,
    extra_vars: tuple[str, ...],
    offline: bool,
    out_of_service: bool,
    output: str,
) -> None:
    """Check what `up` would refuse, changing nothing: every GPU host's planned versions against
    the compatibility matrix and, from the hosts' facts, a change of a loaded driver."""
    session = DeploySession.load(
        RunOptions(inventory=inventory, limit=limit, extra_vars=list(extra_vars))
    )
    refused = session.preflight(offline=offline, out_of_service=out_of_service)
    notes = session.driver_notes()
    if output == "json":
        click.echo(
            json.dumps(
                {
                    "ok": not refused and not session.not_read(),
                    "refusals": [
                        {"host": r.host, "rule": r.rule, "message": r.message, "fix": r.fix}
                        for r in refused
                    ],
                    "unreachable": session.unreachable,
                    "facts_unread": session.unread,
                    "not_judged": session.not_judged,
                    "notes": notes,
                },
                indent=2,
            )
        )
    else:
        for host, note in notes.items():
            click.echo(f"NOTE {host}: {note}", err=True)
        for r in refused:
            click.echo(f"REFUSED {r}", err=True)
        for host, why in session.unreachable.items():
            click.echo(f"UNREACHABLE {host}: {why}", err=True)
        for host, why in session.unread.items():
            click.echo(f"FAILED {host}: its facts could not be read: {why}", err=True)
        for host in session.not_judged:
            click.echo(
                f"NOT JUDGED {host}: no gpu_model in the inventory, and no facts read "
                "(--offline, or unreachable): run check without --offline, or declare gpu_model",
                err=True,
            )
        if not refused and not session.not_read():
            judged = " judged" if session.not_judged else ""
            click.echo(f"compatible: every{judged} GPU host's plan passes the matrix")
    session.pool.close_all()
    if refused:
        sys.exit(EXIT_INPUT)
    sys.exit(EXIT_FAILED if session.not_read() else EXIT_OK)


@cli.command()
@inventory_options
@click.option("--forks", type=click.IntRange(1, 1000), default=50, show_default=True)
@output_option
@input_errors_exit_2
def facts(
    inventory: Path, limit: str | None, extra_vars: tuple[str, ...], forks: int, output: str
) -> None:
    """Gather and print host facts: OS, GPUs, driver versions, DCGM, exporter, NVSwitch."""
    session, _, gathered = _facts_of(inventory, limit, extra_vars, forks)
    if output == "json":
        data = {h: f.to_json() for h, f in gathered.items()}
        shown = {"hosts": data, "unreachable": session.unreachable, "facts_unread": session.unread}
        click.echo(json.dumps(shown, indent=2))
    else:
        for host in session.hosts:
            if (why := _not_read_line(session, host)) is not None:
                click.echo(why)
                continue
            f = gathered[host]
            gpus = f"{len(f.gpus)}x {f.gpus[0].name}" if f.gpus else f"{f.nvidia_pci_gpus} on PCI"
            driver = f"installed={f.driver_installed} loaded={f.driver_loaded} smi={f.driver_smi}"
            flag = "  REBOOT REQUIRED" if f.reboot_required else ""
            click.echo(
                f"{host}: {f.os_id} {f.os_version} {f.arch} kernel {f.kernel}; GPUs {gpus}; "
                f"driver {driver}; dcgm={f.dcgm_version} exporter={f.exporter_version} "
                f"nvswitch={f.nvswitch}{flag}"
            )
    sys.exit(EXIT_FAILED if session.not_read() else EXIT_OK)


def _not_read_line(session: DeploySession, host: str) -> str | None:
    """``host``'s line when this session has no facts of it (``facts``, ``init``), else None."""
    if host in session.unreachable:
        return f"{host}: UNREACHABLE {session.unreachable[host]}"
    if host in session.unread:
        return f"{host}: FAILED its facts could not be read: {session.unread[host]}"
    return None


def _facts_of(
    inventory: Path,
    limit: str | None,
    extra_vars: tuple[str, ...],
    forks: int,
    hosts_of: Callable[[DeploySession], list[str]] | None = None,
) -> tuple[DeploySession, list[str], dict[str, HostFacts]]:
    """One session (no plan), the hosts read (the selected ones, or those ``hosts_of`` picks)
    and, read-only and in parallel, their facts; the connections closed. ``facts`` and ``init``
    read them so."""
    session = DeploySession.load(
        RunOptions(inventory=inventory, limit=limit, extra_vars=list(extra_vars)), plan=False
    )
    hosts = hosts_of(session) if hosts_of is not None else session.hosts
    try:
        return session, hosts, session.gather_facts(hosts, forks)
    finally:
        session.pool.close_all()


@cli.command()
@inventory_options
@click.option("--host", "host", default=None, help="Show one host only.")
@output_option
@input_errors_exit_2
def inventory(
    inventory: Path, limit: str | None, extra_vars: tuple[str, ...], host: str | None, output: str
) -> None:
    """Show resolved hosts, groups and variables (secrets masked)."""
    session = DeploySession.load(
        RunOptions(inventory=inventory, limit=limit, extra_vars=list(extra_vars)), plan=False
    )
    if host is None and limit is not None:
        # The selected hosts only, as ansible-inventory --list --limit shows them.
        data = session.inventory.to_dict(selected=session.hosts)
    else:
        data = session.inventory_view(host)
    if output == "json":
        click.echo(json.dumps(data, indent=2, default=str))
        return
    import yaml

    click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())


@cli.command()
@inventory_options
@output_option
@input_errors_exit_2
def capacity(inventory: Path, limit: str | None, extra_vars: tuple[str, ...], output: str) -> None:
    """Predicted series, samples/s, disk and memory per replica and store; shards recommended."""
    from deployer.monitoring import capacity_plan
    from deployer.monitoring.capacity_view import render_text

    result = capacity_plan.load(inventory, list(extra_vars))
    if output == "json":
        click.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        render_text(result)
    sys.exit(EXIT_OK)


@cli.command()
@inventory_options
@output_option
@input_errors_exit_2
def targets(inventory: Path, limit: str | None, extra_vars: tuple[str, ...], output: str) -> None:
    """Regenerate and push only the Prometheus file_sd targets files (no reload needed)."""
    from deployer.monitoring import targets as file_sd_targets

    # it writes the replicas' targets files, as up does (a hand-over's among them)
    with run_lock.changing(inventory, "targets"):
        session = file_sd_targets.load_session(
            RunOptions(inventory=inventory, limit=limit, extra_vars=list(extra_vars))
        )
        report = file_sd_targets.push_targets(session, json_output=output == "json")
    sys.exit(report.exit_code)


@cli.command()
@click.option("-i", "--inventory", "inventory", required=True, type=click.Path(path_type=Path))
@click.option("-e", "--extra-vars", "extra_vars", multiple=True, metavar="KEY=VALUE|@FILE|JSON")
@click.option(
    "--wait",
    "wait_s",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Check again every 5 s until every check is ok, for at most SECONDS; report the last round.",
)
@click.option(
    "--api-only",
    is_flag=True,
    help="Only the HTTP APIs: no SSH (skips the driver/NVML check of GPU hosts and the "
    "loaded-vs-on-disk check of Prometheus and Alertmanager).",
)
@output_option
@input_errors_exit_2
def status(
    inventory: Path, extra_vars: tuple[str, ...], wait_s: int, api_only: bool, output: str
) -> None:
    """Check the running monitoring stack through its APIs and, read-only over SSH, its hosts.

    Exit status: 0 every check ok; 1 a check failed (each named on stderr); 3 nothing failed but
    something is still pending (a replica that just started has not scraped everything yet): run
    again, or use --wait.
    """
    from deployer.monitoring import check as rows
    from deployer.monitoring import status as stack
    from deployer.monitoring.http import http_fetch

    exp = stack.load_expectation(inventory, list(extra_vars))
    pool = None if api_only else stack.open_hosts(exp)
    try:
        checks = stack.collect_until(
            exp,
            http_fetch,
            pool.get if pool is not None else None,
            wait_s=wait_s,
            replan=lambda: stack.load_expectation(inventory, list(extra_vars)),
        )
    finally:
        if pool is not None:
            pool.close_all()
    if output == "json":
        click.echo(json.dumps(rows.to_json(checks), indent=2))
    else:
        click.echo(rows.table(checks))
    for c in rows.failures(checks):
        click.echo(f"FAILED {c.component} {c.host}: {c.check}: {c.detail}", err=True)
    for c in rows.pending(checks):
        click.echo(f"PENDING {c.component} {c.host}: {c.check}: {c.detail}", err=True)
    if rows.failures(checks):
        sys.exit(EXIT_FAILED)
    sys.exit(stack.EXIT_PENDING if rows.pending(checks) else EXIT_OK)


_ROLLOUT = RolloutOptions()  # upgrade-driver's defaults, shown by --help (defined there only)


@cli.command("upgrade-driver")
@inventory_options
@click.option(
    "--to", "to", default=None, metavar="BRANCH_OR_VERSION", help="Target: 580 or 580.126.20."
)
@click.option(
    "--canary",
    type=int,
    default=_ROLLOUT.canary,
    show_default=True,
    help="Hosts in the first batch.",
)
@click.option("--batch-size", default=_ROLLOUT.batch_size, show_default=True, metavar="N|P%")
@click.option("--max-unavailable", default=None, metavar="N|P%", help="Default: the batch size.")
@click.option(
    "--max-failures",
    type=int,
    default=_ROLLOUT.max_failures,
    show_default=True,
    help="Over the whole run.",
)
@click.option(
    "--drain",
    type=click.Choice(["slurm", "kubernetes", "command", "none"]),
    default=_ROLLOUT.drain,
    show_default=True,
)
@click.option(
    "--drain-command", default=None, help="Template with {host} and {action} (--drain command)."
)
@click.option(
    "--drain-host",
    default=None,
    help="Inventory host that runs the drain hook; default: the controller.",
)
@click.option("--pod-selector", default=None, help="GPU pod selector for kubectl drain.")
@click.option(
    "--job-timeout",
    type=click.IntRange(1, 86400),
    default=_ROLLOUT.job_timeout,
    show_default=True,
    help="Seconds to wait for GPU jobs to end.",
)
@click.option(
    "--reboot",
    type=click.Choice(["auto", "always", "never"]),
    default=_ROLLOUT.reboot,
    show_default=True,
    help="never: reload the modules instead.",
)
@click.option(
    "--silence-minutes",
    type=click.IntRange(5, 10080),
    default=_ROLLOUT.silence_minutes,
    show_default=True,
)
@click.option(
    "--diag-level",
    type=click.IntRange(0, 4),
    default=_ROLLOUT.diag_level,
    show_default=True,
    help="dcgmi diag -r level after the upgrade (0: none).",
)
@click.option(
    "--resume", default=None, metavar="RUN", help="Continue an interrupted run (id or directory)."
)
@click.option("--take-over", "take_over", multiple=True, metavar="RUN",
              help="Take over the nodes a dead run of another controller left drained.")  # fmt: skip
@click.option("--check", "check_mode", is_flag=True, help="Print the plan; change nothing.")
@output_option
@input_errors_exit_2
def upgrade_driver(inventory: Path, limit: str | None, extra_vars: tuple[str, ...], to: str | None,
                   resume: str | None, check_mode: bool, output: str, **choices: Any) -> None:  # fmt: skip
    """Rolling NVIDIA driver upgrade: canary, batches, drain, silences, validation, resume."""
    from deployer.rollout.command import UpgradeRequest
    from deployer.rollout.command import upgrade_driver as run_upgrade

    options = RolloutOptions(limit=limit, extra_vars=tuple(extra_vars), **choices)
    req = UpgradeRequest(
        inventory=inventory, to=to, options=options, resume=resume, check=check_mode, output=output
    )
    with contextlib.nullcontext() if check_mode else run_lock.changing(inventory, "upgrade-driver"):
        code = run_upgrade(req)
    sys.exit(code)


@cli.command("restore")
@click.option("-i", "--inventory", "inventory", required=True, type=click.Path(path_type=Path))
@click.option("-e", "--extra-vars", "extra_vars", multiple=True, metavar="KEY=VALUE|@FILE|JSON")
@click.option("--host", default=None, help="The store host to restore (default: the only one).")
@click.option(
    "--from",
    "source",
    default=None,
    metavar="S3_URL|PATH",
    help="Backup to restore: s3://bucket/path or a path in the host's bucket "
    "(default: the host's own backup, victoriametrics_backup_dst).",
)
@click.option("--yes", is_flag=True, help="Replace the store's data without asking.")
@click.option("--check", "check_mode", is_flag=True, help="Print the steps; change nothing.")
@input_errors_exit_2
def restore(inventory: Path, extra_vars: tuple[str, ...], host: str | None, source: str | None,
            yes: bool, check_mode: bool) -> None:  # fmt: skip
    """Restore a long-term store (VictoriaMetrics) from its vmbackup in the S3 bucket: stop it,
    vmrestore, start it; the replicas' WAL refills the time it was down."""
    from deployer import restore as restore_mod  # imported by the command that uses it

    session, stores = restore_mod.store_variables(inventory, list(extra_vars))
    chosen = restore_mod.choose_host(stores, host, str(inventory))
    the_plan = restore_mod.plan(chosen, stores[chosen], source)
    if check_mode:
        for step in the_plan.steps:
            click.echo(f"{chosen}: {step.name}\n    {mask_text(step.command)}")
        sys.exit(EXIT_OK)
    if not yes and not click.confirm(
        f"Replace the data of the store on {chosen} ({the_plan.data_dir}) with the backup "
        f"{the_plan.source}?",
        default=False,
    ):
        click.echo("nothing was changed", err=True)
        sys.exit(EXIT_INPUT)
    with run_lock.changing(inventory, "restore"):
        try:
            conn = session.pool.get(chosen)

            def run(cmd: str, timeout: float) -> tuple[int, str]:
                result = conn.run(cmd, timeout=timeout)
                return result.rc, result.stdout + result.stderr

            results = restore_mod.execute(the_plan, run, lambda m: click.echo(m, err=True))
        finally:
            session.pool.close_all()
    ok = all(r.ok for r in results) and len(results) == len(the_plan.steps)
    click.echo(
        f"{chosen}: restored from {the_plan.source}"
        if ok
        else f"{chosen}: restore FAILED at: {results[-1].step.name}"
    )
    sys.exit(EXIT_OK if ok else EXIT_FAILED)


@cli.command()
@inventory_options
@click.option("--forks", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option(
    "--check", "check_mode", is_flag=True, help="Print what would be written; write nothing."
)
@input_errors_exit_2
def init(
    inventory: Path,
    limit: str | None,
    extra_vars: tuple[str, ...],
    forks: int,
    check_mode: bool,
) -> None:
    """Read the GPU hosts' facts and write beside the inventory the variables the product needs
    (GPU model and count, NVSwitch, the driver branch loaded now, the --group mapping); existing
    files are never rewritten."""
    from deployer import init_inventory  # imported by the command that uses it

    def gpu_hosts(session: DeploySession) -> list[str]:
        gpu = preflight.gpu_hosts(session.inventory, session.hosts)
        if not gpu:
            raise InputError(
                "no selected host is in group gpu: map your GPU group first (--group gpu=GROUP)",
                source=str(inventory),
                key="gpumon_groups",
            )
        return gpu

    session, gpu, gathered = _facts_of(inventory, limit, extra_vars, forks, gpu_hosts)
    findings = []
    for host in gpu:
        if (why := _not_read_line(session, host)) is not None:
            click.echo(why, err=True)
            continue
        f = init_inventory.finding(host, gathered[host], session.inventory.host(host).vars)
        shown = ", ".join(f"{k}={v}" for k, v in f.found.items())
        click.echo(f"{host}: {shown}" + "".join(f"; {p}" for p in f.problems))
        findings.append(f)
    base = inventory if inventory.is_dir() else inventory.parent
    mapping = session.inventory.extra_vars.get(group_map.VAR)
    plan = init_inventory.plan_files(base, findings, mapping)
    for line in plan.same:
        click.echo(f"already declared: {line}")
    for line in plan.mismatches:
        click.echo(f"MISMATCH {line} (the preflight refuses it: correct the inventory)", err=True)
    for path, values in plan.files.items():
        text = init_inventory.document(values)
        if check_mode:
            click.echo(f"would write {path}:\n{text}")
        elif init_inventory.write_new(path, text):
            click.echo(f"wrote {path}")
        else:
            click.echo(f"{path} exists, not rewritten: add\n{text}", err=True)
    if not plan.files:
        click.echo("nothing to write: the inventory declares what the hosts show")
    problems = session.not_read() or any(f.problems for f in findings) or plan.mismatches
    sys.exit(EXIT_FAILED if problems else EXIT_OK)


def _register_subcommands() -> None:
    """Imports and adds every lazily loaded command (``_Commands.LAZY``)."""
    import importlib

    for name, (module, attr) in _Commands.LAZY.items():
        cli.add_command(getattr(importlib.import_module(module), attr), name)


def main() -> None:
    library_logs.route_everything()
    try:
        code = cli.main(prog_name="gpumon-deploy", standalone_mode=False)
    except click.ClickException as exc:
        # A usage error repeats the value it was given.
        exc.message = mask_text(exc.message)
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(EXIT_FAILED)
    except Exception:
        # A bug: its traceback, masked (an exception's message may repeat a value it was given).
        sys.stderr.write(mask_text(traceback.format_exc()))
        sys.exit(EXIT_FAILED)
    sys.exit(code if isinstance(code, int) else EXIT_OK)


if __name__ == "__main__":
    main()
