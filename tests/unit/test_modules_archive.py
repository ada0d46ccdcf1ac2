"""archive: idempotence by sha256 marker, checksum lists, and a real download/verify/unpack."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from deployer.connection import CommandFailed, CommandResult, ScriptedConnection
from deployer.modules.archive import MARKER, Archive, checksum_for

SHA = "ab" * 32
URL = "http://mirror.lab/prometheus/node_exporter/releases/download/v1.8.2/node_exporter-1.8.2.linux-amd64.tar.gz"


def observe(args: dict, stdout: str):
    m = Archive()
    a = m.validate(dict(args))
    return m, a, m.observe(a, CommandResult("read", 0, stdout, ""))


READS = [
    pytest.param({}, "@marker\n@dest\n", {"installed_sha256": (None, SHA)}, id="not-installed"),
    pytest.param(
        {},
        f"@marker\nsha256={SHA}\nurl={URL}\n@dest\nowner=root\ngroup=root\n",
        {},
        id="installed-same-hash",
    ),
    pytest.param(
        {},
        f"@marker\nsha256={'cd' * 32}\n@dest\n",
        {"installed_sha256": ("cd" * 32, SHA)},
        id="other-version-installed",
    ),
    pytest.param(
        {"owner": "prometheus"},
        f"@marker\nsha256={SHA}\n@dest\nowner=root\ngroup=root\n",
        {"owner": ("root", "prometheus")},
        id="owner-drift",
    ),
    pytest.param(
        {"creates": "node_exporter"},
        f"@marker\nsha256={SHA}\n@dest\nowner=root\ngroup=root\ncreates=0\n",
        {"creates_exists": (False, True)},
        id="creates-missing",
    ),
]


@pytest.mark.parametrize(("extra", "stdout", "expected"), READS)
def test_read_gives_differences(extra: dict, stdout: str, expected: dict) -> None:
    _, _, obs = observe({"url": URL, "dest": "/opt/node_exporter", "sha256": SHA, **extra}, stdout)
    assert obs.differences == expected


SUMS = (
    "1111111111111111111111111111111111111111111111111111111111111111  node_exporter-1.8.2.darwin-amd64.tar.gz\n"
    f"{SHA}  node_exporter-1.8.2.linux-amd64.tar.gz\n"
)


def test_checksum_list_gives_the_expected_hash() -> None:
    assert checksum_for(SUMS, "node_exporter-1.8.2.linux-amd64.tar.gz") == SHA
    assert checksum_for(f"{SHA} *./a.tgz\n", "a.tgz") == SHA
    assert checksum_for(SUMS, "missing.tar.gz") is None


def test_checksum_url_read_compares_with_the_published_hash() -> None:
    _, _, obs = observe(
        {"url": URL, "dest": "/opt/ne", "checksum_url": "http://mirror.lab/sha256sums.txt"},
        f"@marker\nsha256={SHA}\n@dest\n@sums\n{SUMS}",
    )
    assert obs.differences == {}


def test_checksum_list_without_the_file_is_a_read_error() -> None:
    with pytest.raises(ValueError, match="no sha256 for node_exporter"):
        observe(
            {"url": URL, "dest": "/opt/ne", "checksum_url": "http://mirror.lab/sha256sums.txt"},
            "@marker\n@dest\n@sums\n",
        )


def test_write_downloads_verifies_unpacks_and_renames() -> None:
    m, a, obs = observe(
        {"url": URL, "dest": "/opt/ne", "sha256": SHA, "strip_components": 1,
         "owner": "prometheus", "group": "prometheus"},
        "@marker\n@dest\n",
    )  # fmt: skip
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    [script] = conn.commands
    order = [
        "t=$(mktemp -d /opt/.gpumon-archive.XXXXXXXX)",
        f'curl -fsSL --retry 3 --max-time 1800 -o "$t/download" -- {URL}',
        f'if [ "$got" != {SHA} ]',
        "--strip-components=1",
        f'"$t/tree/{MARKER}"',
        'chown -R -- prometheus:prometheus "$t/tree"',
        'mv -T -- "$t/tree" /opt/ne',
    ]
    positions = [script.index(x) for x in order]
    assert positions == sorted(positions)


def test_only_owner_drift_chowns_without_downloading() -> None:
    m, a, obs = observe(
        {"url": URL, "dest": "/opt/ne", "sha256": SHA, "owner": "prometheus"},
        f"@marker\nsha256={SHA}\n@dest\nowner=root\ngroup=root\n",
    )
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    assert conn.commands == ["chown -R -- prometheus /opt/ne"]


# ---- for real, with file:// URLs and sh on this machine ---------------------------------


class Local:
    name = "local"

    def run(self, command, *, stdin=None, timeout=None):
        p = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True)
        return CommandResult(command, p.returncode, p.stdout.decode(), p.stderr.decode())


def make_tarball(path: Path) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in [
            ("ne-1.0/node_exporter", b"#!/bin/sh\necho hi\n"),
            ("ne-1.0/LICENSE", b"L"),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def local_read(m: Archive, a: dict):
    out = Local().run(m.read_script(a))
    return m.observe(a, out)


def test_real_install_then_second_read_is_in_desired_state(tmp_path: Path) -> None:
    tarball = tmp_path / "ne-1.0.tar.gz"
    digest = make_tarball(tarball)
    (tmp_path / "sha256sums.txt").write_text(f"{digest}  ne-1.0.tar.gz\n")
    m = Archive()
    a = m.validate(
        {"url": f"file://{tarball}", "dest": str(tmp_path / "opt" / "ne"),
         "checksum_url": f"file://{tmp_path}/sha256sums.txt",
         "strip_components": 1, "creates": "node_exporter"}
    )  # fmt: skip
    before = local_read(m, a)
    assert set(before.differences) == {"installed_sha256", "creates_exists"}
    m.write(Local(), a, before)
    dest = tmp_path / "opt" / "ne"
    assert (dest / "node_exporter").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert oct(dest.stat().st_mode & 0o777) == "0o755"
    assert local_read(m, a).differences == {}
    assert [p.name for p in (tmp_path / "opt").iterdir()] == ["ne"]  # no temp left


def test_real_checksum_mismatch_fails_and_leaves_nothing(tmp_path: Path) -> None:
    tarball = tmp_path / "ne.tar.gz"
    make_tarball(tarball)
    m = Archive()
    a = m.validate(
        {"url": f"file://{tarball}", "dest": str(tmp_path / "opt" / "ne"), "sha256": SHA}
    )
    with pytest.raises(CommandFailed, match="sha256 mismatch"):
        m.write(Local(), a, local_read(m, a))
    assert list((tmp_path / "opt").iterdir()) == []


def test_real_upgrade_replaces_the_old_tree(tmp_path: Path) -> None:
    old = tmp_path / "opt" / "ne"
    old.mkdir(parents=True)
    (old / "stale").write_text("x")
    tarball = tmp_path / "ne.tar.gz"
    digest = make_tarball(tarball)
    m = Archive()
    a = m.validate({"url": f"file://{tarball}", "dest": str(old), "sha256": digest})
    m.write(Local(), a, local_read(m, a))
    assert sorted(p.name for p in old.iterdir()) == [MARKER, "ne-1.0"]
    assert [p.name for p in (tmp_path / "opt").iterdir()] == ["ne"]
