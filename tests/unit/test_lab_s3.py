"""The lab's S3 server (moto, deployer/lab/s3.py): keys generated once and kept 0600, handed to
the inventory in a 0600 group_vars file, and a real moto server that creates the bucket and holds
objects. The server test binds a loopback port only."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from deployer.lab import procs, s3


def test_keys_are_generated_once_and_kept_0600(tmp_path: Path):
    first = s3.credentials(tmp_path)
    assert s3.credentials(tmp_path) == first
    assert (tmp_path / s3.CREDENTIALS_FILE).stat().st_mode & 0o777 == 0o600
    assert first.access_key_id != first.secret_access_key


def test_inventory_gets_the_keys_in_a_0600_group_vars_file_and_no_secret_in_its_vars(tmp_path):
    creds = s3.credentials(tmp_path)
    path = s3.write_group_vars(tmp_path, creds)
    assert path == tmp_path / "group_vars" / "metrics_store.yml"
    assert path.stat().st_mode & 0o777 == 0o600
    data = yaml.safe_load(path.read_text())
    assert data["victoriametrics_backup_s3_secret_access_key"] == creds.secret_access_key
    public = s3.inventory_vars("10.213.0.1")
    assert public == {
        "victoriametrics_backup_s3_endpoint": "http://10.213.0.1:8690",
        "victoriametrics_backup_s3_bucket": s3.BUCKET,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(not s3.available(), reason="moto[server] is not installed")
def test_server_creates_the_bucket_holds_objects_and_stops(tmp_path: Path):
    port = _free_port()
    try:
        s3.start(tmp_path, "127.0.0.1", port)
        url = s3.endpoint("127.0.0.1", port)
        creds = s3.credentials(tmp_path)
        s3.client(url, creds).put_object(Bucket=s3.BUCKET, Key="gpumon/x/part", Body=b"1")
        assert s3.objects(url, creds, prefix="gpumon/") == ["gpumon/x/part"]
        assert s3.status(tmp_path, "127.0.0.1", port)["serving"]
        server = procs.load(tmp_path / s3.PID_FILE)
        assert server is not None and server.alive()
    finally:
        s3.shutdown(tmp_path)
    assert not server.alive()
    assert not (tmp_path / s3.GROUP_VARS_FILE).exists()
    assert not s3.status(tmp_path, "127.0.0.1", port)["serving"]
