"""The simulated dcgm-exporter with ``--web-config-file``: TLS and basic auth as the real one
serves them through exporter-toolkit (deployer/lab/gpusim/standins/webconfig.py)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from deployer.lab.gpusim import build_packages, hardware_for, prepare_root
from deployer.lab.gpusim.sandbox import Daemon, free_port, pick, unpack
from deployer.monitoring.http import basic_auth
from deployer.tls import ca
from deployer.tls.hashing import password_hash

DRIVER_580 = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
              "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip
PACKAGES = (
    *DRIVER_580,
    "datacenter-gpu-manager-4-core_4.4.2",
    "datacenter-gpu-manager-exporter_4.7.1",
)
PASSWORD = "s3cret-scrape-pw"


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


@pytest.fixture
def tls_host(tmp_path: Path, debs):
    """A simulated GPU host whose exporter serves TLS and basic auth, and the CA that signed it."""
    root = tmp_path / "root"
    unpack(pick(debs, *PACKAGES), root)
    prepare_root(root, hardware_for("H100", 2, "gpu01", True))
    authority = ca.ensure_ca(tmp_path / "ca")
    issued = ca.issue_host(authority, tmp_path / "ca", "gpu01", ["127.0.0.1", "localhost"],
                           days=30, renew_days=5)  # fmt: skip
    conf = root / "etc/dcgm-exporter"
    (conf / "cert.pem").write_text(issued.cert_pem)
    (conf / "key.pem").write_text(issued.key_pem)
    hashed = password_hash(PASSWORD, tmp_path / "hash")
    web = {
        "tls_server_config": {"cert_file": "/etc/dcgm-exporter/cert.pem",
                              "key_file": "/etc/dcgm-exporter/key.pem", "min_version": "TLS12"},
        "basic_auth_users": {"gpumon": hashed},
    }  # fmt: skip
    (conf / "web-config.yml").write_text(json.dumps(web))
    port = free_port()
    with Daemon(root, exporter_argv(port), port):
        yield root, port, authority, tmp_path


def exporter_argv(port: int) -> list[str]:
    """The simulated exporter's command line with the web config both tests write."""
    return ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{port}",
            "-f", "/etc/dcgm-exporter/default-counters.csv",
            "--web-config-file", "/etc/dcgm-exporter/web-config.yml"]  # fmt: skip


def get(url: str, ca_pem: str | None, headers: dict[str, str] | None = None) -> int:
    ctx = ssl.create_default_context(cadata=ca_pem) if ca_pem else None
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        assert exc.headers.get("WWW-Authenticate") == "Basic"
        return exc.code


def test_the_right_credentials_over_tls_get_the_metrics(tls_host) -> None:
    _, port, authority, _ = tls_host
    url = f"https://127.0.0.1:{port}/metrics"
    assert get(url, authority.cert_pem, basic_auth("gpumon", PASSWORD)) == 200


def test_no_or_wrong_credentials_get_401(tls_host) -> None:
    _, port, authority, _ = tls_host
    url = f"https://127.0.0.1:{port}/metrics"
    assert get(url, authority.cert_pem) == 401
    assert get(url, authority.cert_pem, basic_auth("gpumon", "wrong")) == 401
    assert get(url, authority.cert_pem, basic_auth("other", PASSWORD)) == 401


def test_a_client_trusting_another_ca_fails_the_handshake(tls_host) -> None:
    _, port, _, tmp = tls_host
    foreign = ca.ensure_ca(tmp / "foreign")
    with pytest.raises(urllib.error.URLError) as err:
        get(f"https://127.0.0.1:{port}/metrics", foreign.cert_pem, basic_auth("gpumon", PASSWORD))
    assert isinstance(err.value.reason, ssl.SSLCertVerificationError)


def test_plain_http_to_the_tls_port_gets_no_metrics(tls_host) -> None:
    _, port, _, _ = tls_host
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()


def test_a_new_password_hash_applies_to_the_next_request_without_a_restart(tls_host) -> None:
    root, port, authority, tmp = tls_host
    web_file = root / "etc/dcgm-exporter/web-config.yml"
    web = json.loads(web_file.read_text())
    web["basic_auth_users"] = {"gpumon": password_hash("rotated-pw-2", tmp / "hash")}
    web_file.write_text(json.dumps(web))
    url = f"https://127.0.0.1:{port}/metrics"
    assert get(url, authority.cert_pem, basic_auth("gpumon", "rotated-pw-2")) == 200
    assert get(url, authority.cert_pem, basic_auth("gpumon", PASSWORD)) == 401


def test_a_renewed_certificate_is_served_on_the_next_connection(tls_host) -> None:
    root, port, _, tmp = tls_host
    other = ca.ensure_ca(tmp / "ca2")
    issued = ca.issue_host(other, tmp / "ca2", "gpu01", ["127.0.0.1"], days=30, renew_days=5)
    (root / "etc/dcgm-exporter/cert.pem").write_text(issued.cert_pem)
    (root / "etc/dcgm-exporter/key.pem").write_text(issued.key_pem)
    assert get(f"https://127.0.0.1:{port}/metrics", other.cert_pem,
               basic_auth("gpumon", PASSWORD)) == 200  # fmt: skip


def test_the_block_yaml_form_of_a_web_config_is_read_too() -> None:
    from deployer.lab.gpusim.standins import webconfig

    text = (
        "# Managed\ntls_server_config:\n  cert_file: /a/cert.pem\n  key_file: /a/key.pem\n"
        'basic_auth_users:\n  gpumon: "$2b$10$abc"\n'
    )
    assert webconfig.parse(text) == {
        "tls_server_config": {"cert_file": "/a/cert.pem", "key_file": "/a/key.pem"},
        "basic_auth_users": {"gpumon": "$2b$10$abc"},
    }


def test_an_unknown_field_in_the_web_config_stops_the_exporter(tmp_path: Path, debs) -> None:
    root = tmp_path / "root"
    unpack(pick(debs, *PACKAGES), root)
    prepare_root(root, hardware_for("H100", 1, "gpu01", True))
    (root / "etc/dcgm-exporter/web-config.yml").write_text('{"tls_server_confg": {}}')
    from deployer.lab.gpusim.sandbox import run

    result = run(root, ["/usr/bin/dcgm-exporter", "-a", f"127.0.0.1:{free_port()}",
                        "--web-config-file", "/etc/dcgm-exporter/web-config.yml"])  # fmt: skip
    assert result.returncode == 1
    assert "tls_server_confg" in result.stderr


def one_file_host(tmp_path: Path, debs) -> tuple[Path, ca.Authority, ca.Issued]:
    """A simulated GPU host whose web config names one file, server.pem, as cert_file and
    key_file (what gpumon_tls writes), holding a key and certificate of a new CA."""
    root = tmp_path / "root"
    unpack(pick(debs, *PACKAGES), root)
    prepare_root(root, hardware_for("H100", 1, "gpu01", True))
    authority = ca.ensure_ca(tmp_path / "ca")
    issued = ca.issue_host(
        authority, tmp_path / "ca", "gpu01", ["127.0.0.1"], days=30, renew_days=5
    )
    (root / "etc/dcgm-exporter/server.pem").write_text(issued.key_pem + issued.cert_pem)
    web = {"tls_server_config": {"cert_file": "/etc/dcgm-exporter/server.pem",
                                 "key_file": "/etc/dcgm-exporter/server.pem"}}  # fmt: skip
    (root / "etc/dcgm-exporter/web-config.yml").write_text(json.dumps(web))
    return root, authority, issued


def test_one_file_holding_the_key_and_the_certificate_serves(tmp_path: Path, debs) -> None:
    """What gpumon_tls writes: cert_file and key_file are the same file (server.pem)."""
    root, authority, _ = one_file_host(tmp_path, debs)
    port = free_port()
    with Daemon(root, exporter_argv(port), port):
        assert get(f"https://127.0.0.1:{port}/metrics", authority.cert_pem) == 200


def test_a_failed_handshake_or_tls_config_is_logged_naming_the_client(tmp_path: Path, debs) -> None:
    """What the exporter's journal shows when a scrape fails at TLS: Go's net/http logs each
    failed handshake ("http: TLS handshake error from <client>: ..."; plain HTTP to the TLS port
    it answers with a 400 and does not log), and a certificate that cannot be loaded for a
    connection is logged before that connection is dropped."""
    root, authority, issued = one_file_host(tmp_path, debs)
    server_pem = root / "etc/dcgm-exporter/server.pem"
    foreign = ca.ensure_ca(tmp_path / "foreign")
    other = ca.issue_host(foreign, tmp_path / "foreign", "gpu01", ["127.0.0.1"], days=30,
                          renew_days=5)  # fmt: skip
    port = free_port()
    url = f"https://127.0.0.1:{port}/metrics"
    with Daemon(root, exporter_argv(port), port) as daemon:
        with pytest.raises(urllib.error.URLError):
            get(url, foreign.cert_pem)  # the client refuses the exporter's certificate
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        server_pem.write_text(issued.key_pem + other.cert_pem)  # a key and another's certificate
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            get(url, authority.cert_pem)
    handshakes = [ln for ln in daemon.stderr.splitlines() if "http: TLS handshake error" in ln]
    assert any("from 127.0.0.1:" in ln and "unknown ca" in ln for ln in handshakes), daemon.stderr
    assert not any("http request" in ln for ln in handshakes), "plain HTTP is answered, not logged"
    assert "TLS configuration error" in daemon.stderr and "KEY_VALUES_MISMATCH" in daemon.stderr
