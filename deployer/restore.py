"""``gpumon-deploy restore``: a long-term store brought back from its backup in the bucket.

The store host must already run the victoriametrics role (``up``: binaries, unit, the 0600 S3
credentials file). Restore then, on that host: stops the backup timer (a backup of a store being
restored would overwrite the bucket), stops VictoriaMetrics, runs ``vmrestore`` as the store's
user in a hardened transient unit (it makes the storage directory equal to the backup, like
``rsync --delete``, downloading only the parts it lacks), starts VictoriaMetrics, waits until it
answers, and starts the backup timer again (its next backup one interval later).

The replicas keep writing while the store is down and replay their WAL once it is back, so the
restored store ends with: the backup's data, then the time since the restore started; what the
old store got between the last backup and its loss is gone (the recovery point is the backup
interval).

A ``vmrestore`` that fails leaves ``restore-in-progress`` in the storage directory and
VictoriaMetrics refuses to start on it (VictoriaMetrics v1.79.5 lib/storage/storage.go:188-192):
the store stays stopped and the error says to run ``restore`` again (or with ``--from`` another
backup). Each step is data (:class:`Step`), so the sequence is tested without a host.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.monitoring.file_sd import truthy
from deployer.secrets import mask_text

HEALTH_WAIT_S = 180
ROLE = "victoriametrics"


@dataclass(frozen=True)
class Step:
    name: str
    command: str
    timeout: float = 120.0
    # What to tell the operator when this step fails (the store's state after it).
    on_failure: str = ""


@dataclass
class RestorePlan:
    host: str
    source: str
    data_dir: str
    steps: list[Step] = field(default_factory=list)


def source_url(variables: Mapping[str, Any], given: str | None) -> str:
    """``s3://bucket/path`` of the backup: ``--from`` (a full URL, or a path in the host's
    bucket), else the host's own backup destination."""
    if not given:
        return str(variables["victoriametrics_backup_dst"])
    if "://" in given:
        if not given.startswith(("s3://", "gs://", "fs://")):
            raise InputError(
                f"not a backup location: {given!r} (s3://, gs:// or fs://)", key="--from"
            )
        return given
    bucket = str(variables["victoriametrics_backup_s3_bucket"])
    return f"s3://{bucket}/{given.strip('/')}"


def plan(host: str, variables: Mapping[str, Any], given_source: str | None = None) -> RestorePlan:
    """The steps that restore ``host``'s store from its backup (``variables``: the host's
    resolved variables of the victoriametrics play)."""
    if not truthy(variables["victoriametrics_backup_enabled"]):
        raise InputError(
            f"{host}: backups are not configured (victoriametrics_backup_s3_bucket is empty), so "
            "there is nothing to restore from",
            key="victoriametrics_backup_s3_bucket",
        )
    if not str(variables["victoriametrics_backup_s3_access_key_id"] or ""):
        raise InputError(
            f"{host}: victoriametrics_backup_s3_access_key_id is not set",
            key="victoriametrics_backup_s3_access_key_id",
        )
    src = source_url(variables, given_source)
    data = str(variables["victoriametrics_data_dir"])
    user = str(variables["victoriametrics_user"])
    bin_dir = str(variables["victoriametrics_bin_dir"])
    port = int(variables["metrics_store_port"])
    args = [
        f"{bin_dir}/vmrestore",
        f"-src={src}",
        f"-storageDataPath={data}",
        f"-credsFilePath={variables['victoriametrics_backup_credentials_file']}",
        f"-concurrency={variables['victoriametrics_backup_concurrency']}",
        f"-maxBytesPerSecond={variables['victoriametrics_backup_max_bytes_per_second']}",
        "-httpListenAddr=127.0.0.1:8421",
    ]
    endpoint = str(variables["victoriametrics_backup_s3_endpoint"] or "")
    if endpoint:
        args.insert(4, f"-customS3Endpoint={endpoint}")
    # The same confinement as the server's unit: the store's user, writing only its data.
    transient = [
        "systemd-run",
        "--wait",
        "--pipe",
        "--collect",
        "--quiet",
        "--unit=gpumon-vmrestore",
        f"--uid={user}",
        f"--gid={user}",
        "-p",
        "NoNewPrivileges=yes",
        "-p",
        "ProtectSystem=strict",
        "-p",
        f"ReadWritePaths={data}",
        "-p",
        "ProtectHome=yes",
        "-p",
        "PrivateTmp=yes",
        "--",
        *args,
    ]
    health = (
        f"for i in $(seq {HEALTH_WAIT_S // 2}); do "
        f"curl -fsS --max-time 2 http://127.0.0.1:{port}/health >/dev/null && exit 0; "
        "sleep 2; done; exit 1"
    )
    backup_wait = _seconds(variables["victoriametrics_backup_timeout"])
    restart_hint = (
        f"run `gpumon-deploy restore` again (or `--from` another backup); until then "
        f"{data}/restore-in-progress keeps VictoriaMetrics stopped on {host}"
    )
    steps = [
        Step(
            # A backup cut short leaves the bucket's copy without its "backup complete" file,
            # which vmrestore refuses: a running backup is waited for, never stopped.
            "backup timer stopped, no backup running",
            "systemctl stop gpumon-vmbackup.timer && "
            f"for i in $(seq {backup_wait // 2}); do "
            "systemctl is-active -q gpumon-vmbackup.service || exit 0; sleep 2; done; exit 1",
            timeout=float(backup_wait + 60),
            on_failure="a backup is still running; nothing was restored (the timer is stopped)",
        ),
        Step(
            "victoria-metrics stopped",
            "systemctl stop victoria-metrics.service",
            timeout=360,
            on_failure="the store may still be running; nothing was restored",
        ),
        Step(
            f"vmrestore from {src}",
            shlex.join(transient),
            timeout=float(_seconds(variables["victoriametrics_backup_timeout"])),
            on_failure=restart_hint,
        ),
        Step("victoria-metrics started", "systemctl start victoria-metrics.service"),
        Step("victoria-metrics answers /health", health, timeout=HEALTH_WAIT_S + 30),
        Step(
            "backup timer started (next backup one interval from now)",
            "systemctl start gpumon-vmbackup.timer",
        ),
    ]
    return RestorePlan(host=host, source=src, data_dir=data, steps=steps)


def _seconds(duration: Any) -> int:
    """A systemd time span as the role writes it (``6h``, ``90m``, ``3600``) in seconds."""
    from deployer.monitoring.remote_write import seconds

    text = str(duration).strip()
    return int(text) if text.isdigit() else int(seconds(text))


@dataclass
class StepResult:
    step: Step
    ok: bool
    output: str


Runner = Callable[[str, float], tuple[int, str]]  # command, timeout -> (rc, stdout+stderr)


def execute(plan_: RestorePlan, run: Runner, echo: Callable[[str], None]) -> list[StepResult]:
    """Run the steps in order, stopping at the first that fails; output is masked."""
    results = []
    for step in plan_.steps:
        rc, output = run(step.command, step.timeout)
        output = mask_text(output)
        result = StepResult(step, rc == 0, output)
        results.append(result)
        echo(f"{'ok' if result.ok else 'FAILED'}  {plan_.host}: {step.name}")
        if not result.ok:
            tail = "\n".join(output.strip().splitlines()[-15:])
            if tail:
                echo(tail)
            if step.on_failure:
                echo(f"{plan_.host}: {step.on_failure}")
            break
    return results


# ---------------------------------------------------------------- from an inventory


def store_variables(
    inventory: Path, extra_vars: list[str] | None = None
) -> tuple[Any, dict[str, Mapping[str, Any]]]:
    """The session and each store host's resolved variables (the site's victoriametrics play)."""
    from deployer.session import DeploySession, RunOptions

    session = DeploySession.load(
        RunOptions(inventory=inventory, extra_vars=list(extra_vars or [])), plan=False
    )
    session.load_content()
    if not any(ROLE in p.roles for p in session.site_plays):
        raise InputError("the site has no play with the victoriametrics role", key=ROLE)
    return session, session.role_variables(ROLE)


def choose_host(stores: Mapping[str, Any], host: str | None, source: str) -> str:
    if not stores:
        raise InputError(
            "no host of the inventory is in the store's group (metrics_store): nothing to restore",
            source=source,
        )
    if host is None:
        if len(stores) > 1:
            raise InputError(
                f"several store hosts ({', '.join(stores)}): name one with --host", key="--host"
            )
        return next(iter(stores))
    if host not in stores:
        raise InputError(
            f"{host} is not a store host (store hosts: {', '.join(stores)})", key="--host"
        )
    return host
