"""The lab's S3-compatible object store: moto's server (PyPI ``moto[server]``) on the lab bridge.

The long-term store's disaster-recovery backups (role victoriametrics: vmbackup/vmrestore) need a
bucket. In the lab that bucket lives in a moto server this module starts on the bridge's own
address (the machine side, like the mirror), so the hosts reach it and nothing else does; it
holds objects in memory, for as long as the lab is up. ``lab up`` starts it and creates the
bucket, ``lab down`` ends it (by PID and start time, like every process the lab starts).

The access keys are generated once per lab (``<lab>/s3-credentials.json``, 0600). moto accepts
any key, but the product treats them as the secrets they would be at a site: the lab hands them
to the inventory in ``<lab>/group_vars/metrics_store.yml`` (0600), beside the inventory, never in
the inventory file itself.

Bounded: the server's address space is limited (``MEMORY_LIMIT_BYTES``), and every wait here has
a deadline.
"""

from __future__ import annotations

import json
import resource
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deployer.lab import localserver, procs
from deployer.lab.paths import write_secret

S3_PORT = 8690
BUCKET = "gpumon-lab-backups"
START_WAIT_S = 30.0
MEMORY_LIMIT_BYTES = 4 << 30
PID_FILE = "s3.pid"
LOG_FILE = "s3.log"
CREDENTIALS_FILE = "s3-credentials.json"
GROUP_VARS_FILE = Path("group_vars") / "metrics_store.yml"


class S3Error(RuntimeError):
    """The lab's S3 server could not be started or its bucket created."""


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str


def available() -> bool:
    """True when moto's server can be started here (``moto[server]`` is installed)."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        return False
    return True


def endpoint(address: str, port: int = S3_PORT) -> str:
    return f"http://{address}:{port}"


def credentials(lab_dir: Path) -> Credentials:
    """The lab's S3 keys, generated on first use and kept 0600 in the lab's directory."""
    path = lab_dir / CREDENTIALS_FILE
    try:
        data = json.loads(path.read_text())
        return Credentials(str(data["access_key_id"]), str(data["secret_access_key"]))
    except (FileNotFoundError, ValueError, KeyError):
        pass
    creds = Credentials(
        "GPUMONLAB" + secrets.token_hex(6).upper(), secrets.token_urlsafe(30).replace("-", "x")
    )
    write_secret(path, json.dumps(creds.__dict__))
    return creds


def inventory_vars(address: str, port: int = S3_PORT) -> dict[str, str]:
    """What the lab inventory says about the bucket (no secret)."""
    return {
        "victoriametrics_backup_s3_endpoint": endpoint(address, port),
        "victoriametrics_backup_s3_bucket": BUCKET,
    }


def write_group_vars(lab_dir: Path, creds: Credentials) -> Path:
    """``group_vars/metrics_store.yml`` beside the lab inventory: the S3 keys, 0600."""
    path = lab_dir / GROUP_VARS_FILE
    text = (
        "# Written by `gpumon-deploy lab up`: the lab's S3 keys (moto server on the lab bridge).\n"
        + yaml.safe_dump(
            {
                "victoriametrics_backup_s3_access_key_id": creds.access_key_id,
                "victoriametrics_backup_s3_secret_access_key": creds.secret_access_key,
            },
            sort_keys=True,
        )
    )
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_secret(path, text)
    return path


def _limit_resources() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def serve(address: str, port: int, pid_file: Path, log: Path) -> procs.Tracked:
    """Start (or keep) moto's server on ``address:port``; PID recorded in ``pid_file``."""
    argv = [sys.executable, "-m", "moto.server", "-H", address, "-p", str(port)]
    server = localserver.serve(
        argv,
        pid_file,
        log,
        lambda: _answers(address, port),
        wait_s=START_WAIT_S,
        preexec_fn=_limit_resources,
    )
    if server is None:
        raise S3Error(f"the lab's S3 server did not answer on {address}:{port}; see {log}")
    return server


def stop(pid_file: Path) -> None:
    localserver.stop(pid_file)


def _answers(address: str, port: int) -> bool:
    return localserver.answers(address, port, "moto-api/")


def client(url: str, creds: Credentials) -> Any:
    """A boto3 S3 client for the lab's server (path-style, as vmbackup uses it)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def ensure_bucket(url: str, creds: Credentials, bucket: str = BUCKET) -> None:
    s3 = client(url, creds)
    names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if bucket not in names:
        s3.create_bucket(Bucket=bucket)


def objects(url: str, creds: Credentials, prefix: str = "", bucket: str = BUCKET) -> list[str]:
    """Every key under ``prefix`` (for tests and ``lab status``)."""
    s3 = client(url, creds)
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def start(lab_dir: Path, address: str, port: int = S3_PORT) -> dict[str, str]:
    """Serve, create the bucket, write the keys for the inventory; the inventory's S3 vars."""
    creds = credentials(lab_dir)
    serve(address, port, lab_dir / PID_FILE, lab_dir / LOG_FILE)
    try:
        ensure_bucket(endpoint(address, port), creds)
    except Exception as exc:  # botocore raises many kinds; the message names the cause
        raise S3Error(f"cannot create bucket {BUCKET} on the lab's S3 server: {exc}") from exc
    write_group_vars(lab_dir, creds)
    return inventory_vars(address, port)


def shutdown(lab_dir: Path) -> None:
    """End the server and remove what ``start`` wrote (the keys stay for the next ``lab up``)."""
    stop(lab_dir / PID_FILE)
    (lab_dir / GROUP_VARS_FILE).unlink(missing_ok=True)


def status(lab_dir: Path, address: str, port: int = S3_PORT) -> Mapping[str, Any]:
    server = procs.load(lab_dir / PID_FILE)
    return {
        "url": endpoint(address, port),
        "bucket": BUCKET,
        "serving": bool(server and server.alive() and _answers(address, port)),
    }
