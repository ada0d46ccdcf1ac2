"""apt_repository, apt_preferences, dnf_repository: rendered files, key handling, writes."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deployer.connection import CommandResult, ScriptedConnection
from deployer.modules.repositories import (
    AptPreferences,
    AptRepository,
    BadKey,
    DnfRepository,
    dearmor,
)

BINARY_KEY = b"\x99\x01\x0d\x04fakekeymaterial" * 4


def armor(data: bytes, headers: str = "") -> str:
    from deployer.modules.repositories import _crc24

    body = base64.b64encode(data).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    crc = base64.b64encode(_crc24(data).to_bytes(3, "big")).decode()
    return (
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n"
        + headers
        + "\n"
        + "\n".join(lines)
        + f"\n={crc}\n-----END PGP PUBLIC KEY BLOCK-----\n"
    )


NVIDIA = {
    "name": "nvidia-cuda",
    "uris": "http://mirror.lab/cuda/debian12/x86_64/",
    "suites": "/",
    "key_url": "http://mirror.lab/cuda/debian12/x86_64/3bf863cc.pub",
}


def stat_block(exists: bool, sha: str = "", mode: str = "644") -> str:
    if not exists:
        return "exists=0\n"
    return f"exists=1\ntype=regular file\nowner=root\ngroup=root\nmode={mode}\nlink='x'\nsha256={sha}\n"


def repo_read(source_sha: str | None, keyring_sha: str | None, fetched: bytes | None) -> str:
    out = "@keyring\n" + stat_block(keyring_sha is not None, keyring_sha or "")
    out += "@source\n" + stat_block(source_sha is not None, source_sha or "")
    if fetched is not None:
        out += "@fetch\nkey=" + base64.b64encode(fetched).decode() + "\n"
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- dearmor ---------------------------------------------------------------------------


def test_dearmor_decodes_an_armored_block_with_headers() -> None:
    text = armor(BINARY_KEY, headers="Version: GnuPG v2\nComment: test\n")
    assert dearmor(text.encode()) == BINARY_KEY


def test_dearmor_passes_binary_keys_through() -> None:
    assert dearmor(BINARY_KEY) == BINARY_KEY


def test_dearmor_concatenates_several_blocks() -> None:
    text = armor(b"\x99first") + armor(b"\x99second")
    assert dearmor(text.encode()) == b"\x99first\x99second"


@pytest.mark.parametrize(
    "data",
    [b"hello", b"", armor(BINARY_KEY).replace("=", "=AAAA", 1).encode()],
    ids=["text", "empty", "bad-crc"],
)
def test_dearmor_refuses_what_is_not_a_key(data: bytes) -> None:
    with pytest.raises(BadKey):
        dearmor(data)


@pytest.fixture(autouse=True)
def no_gpg_agent_left(tmp_path):
    """gpg starts an agent per home directory; end every one these tests started."""
    yield
    if shutil.which("gpgconf") is None:
        return
    for home in [tmp_path, *(p for p in tmp_path.rglob("*") if p.is_dir())]:
        if (home / "pubring.kbx").exists() or (home / "private-keys-v1.d").exists():
            subprocess.run(
                ["gpgconf", "--homedir", str(home), "--kill", "all"],
                capture_output=True,
                check=False,
            )


@pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg")
def test_dearmor_matches_gpg_dearmor_on_a_real_key(tmp_path: Path) -> None:
    env = {**os.environ, "GNUPGHOME": str(tmp_path)}
    os.chmod(tmp_path, 0o700)
    subprocess.run(
        ["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "lab <lab@example>",
         "ed25519", "sign", "never"],
        env=env, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    armored = subprocess.run(
        ["gpg", "--armor", "--export"], env=env, check=True, capture_output=True
    ).stdout
    (tmp_path / "k.asc").write_bytes(armored)
    binary = subprocess.run(
        ["gpg", "--dearmor", "--output", "-", str(tmp_path / "k.asc")],
        env=env, check=True, capture_output=True,
    ).stdout  # fmt: skip
    assert dearmor(armored) == binary


# ---- apt_repository ----------------------------------------------------------------------


def test_deb822_source_names_the_modules_keyring() -> None:
    m = AptRepository()
    a = m.validate(dict(NVIDIA))
    assert m.source_path(a) == "/etc/apt/sources.list.d/nvidia-cuda.sources"
    assert m.source_content(a) == (
        "Types: deb\n"
        "URIs: http://mirror.lab/cuda/debian12/x86_64/\n"
        "Suites: /\n"
        "Signed-By: /etc/apt/keyrings/nvidia-cuda.gpg\n"
    )


def test_one_line_source_with_components_and_arch() -> None:
    m = AptRepository()
    a = m.validate(
        {
            **NVIDIA,
            "suites": "bookworm",
            "components": ["main", "contrib"],
            "architectures": "amd64",
            "format": "one-line",
        }
    )
    assert m.source_path(a).endswith("/nvidia-cuda.list")
    assert m.source_content(a) == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/nvidia-cuda.gpg] "
        "http://mirror.lab/cuda/debian12/x86_64/ bookworm main contrib\n"
    )


def test_read_fetches_the_key_on_the_host() -> None:
    m = AptRepository()
    script = m.read_script(m.validate(dict(NVIDIA)))
    assert "curl -fsSL" in script and NVIDIA["key_url"] in script
    assert "stat --printf" in script


@pytest.mark.parametrize(
    ("have_source", "have_key", "expected"),
    [
        (False, False, {"source.state", "source.sha256", "keyring.state", "keyring.sha256"}),
        (True, True, set()),
        (True, False, {"keyring.state", "keyring.sha256"}),
        ("stale", True, {"source.sha256"}),
        (True, "rotated", {"keyring.sha256"}),
    ],
)
def test_differences_by_file(have_source, have_key, expected) -> None:
    m = AptRepository()
    a = m.validate(dict(NVIDIA))
    source = sha(m.source_content(a).encode())
    armored = armor(BINARY_KEY).encode()
    src = {True: source, False: None, "stale": "0" * 64}[have_source]
    key = {True: sha(BINARY_KEY), False: None, "rotated": "1" * 64}[have_key]
    obs = m.observe(a, CommandResult("", 0, repo_read(src, key, armored), ""))
    assert set(obs.differences) >= expected
    assert {k for k in obs.differences if k.endswith(("sha256", "state"))} == expected


def test_unfetchable_key_is_a_read_error() -> None:
    m = AptRepository()
    a = m.validate(dict(NVIDIA))
    read = repo_read(None, None, None) + "@fetch\nkey_error=1\n"
    with pytest.raises(ValueError, match="cannot fetch the signing key"):
        m.observe(a, CommandResult("", 0, read, ""))


def test_write_installs_the_fetched_key_dearmored_then_source_then_updates_that_source() -> None:
    m = AptRepository()
    a = m.validate(dict(NVIDIA))
    obs = m.observe(a, CommandResult("", 0, repo_read(None, None, armor(BINARY_KEY).encode()), ""))
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    mkdir, key, source, update = conn.commands
    assert mkdir == "mkdir -p -m 0755 -- /etc/apt/keyrings"
    assert 'mv -f -- "$t" /etc/apt/keyrings/nvidia-cuda.gpg' in key
    assert "chmod 644" in key and "chown -- root:root" in key
    assert conn.stdins[1] == BINARY_KEY
    assert "/etc/apt/sources.list.d/nvidia-cuda.sources" in source
    assert conn.stdins[2] == m.source_content(a).encode()
    assert "-o Dir::Etc::sourcelist=sources.list.d/nvidia-cuda.sources" in update
    assert "-o Dir::Etc::sourceparts=-" in update and "List-Cleanup=0 update" in update


def test_the_write_installs_the_key_of_its_own_observation_not_the_last_one_read() -> None:
    other = b"\x99\x01\x0d\x04otherkeymaterial" * 4
    m = AptRepository()
    a = m.validate(dict(NVIDIA))
    obs = m.observe(a, CommandResult("", 0, repo_read(None, None, armor(BINARY_KEY).encode()), ""))
    m.observe(a, CommandResult("", 0, repo_read(None, None, armor(other).encode()), ""))
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    assert conn.stdins[1] == BINARY_KEY
    assert vars(m) == {}  # nothing kept on the module between calls


def test_inline_key_is_installed_without_fetching() -> None:
    m = AptRepository()
    args = {k: v for k, v in NVIDIA.items() if k != "key_url"} | {"key": armor(BINARY_KEY)}
    a = m.validate(args)
    assert "curl" not in m.read_script(a)
    obs = m.observe(a, CommandResult("", 0, repo_read(None, None, None), ""))
    assert obs.differences["keyring.sha256"] == (None, sha(BINARY_KEY))


def test_absent_removes_source_and_keyring() -> None:
    m = AptRepository()
    a = m.validate({**NVIDIA, "state": "absent"})
    obs = m.observe(a, CommandResult("", 0, repo_read("a" * 64, "b" * 64, None), ""))
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    assert conn.commands == [
        "rm -f -- /etc/apt/sources.list.d/nvidia-cuda.sources /etc/apt/keyrings/nvidia-cuda.gpg"
    ]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_read_script_fetches_a_key_for_real(tmp_path: Path) -> None:
    keyfile = tmp_path / "key.asc"
    keyfile.write_text(armor(BINARY_KEY, headers="Comment: lab\n"))
    m = AptRepository()
    a = m.validate({**NVIDIA, "name": "gpumon-test-nonexistent", "key_url": f"file://{keyfile}"})
    out = subprocess.run(["sh", "-c", m.read_script(a)], capture_output=True, text=True)
    obs = m.observe(a, CommandResult("", out.returncode, out.stdout, ""))
    assert obs.actual["fetched_key.sha256"] == sha(BINARY_KEY)
    assert obs.actual["keyring.state"] == "absent"


# ---- apt_preferences and dnf_repository --------------------------------------------------


def test_apt_pin_file_content() -> None:
    m = AptPreferences()
    a = m.validate(
        {"name": "nvidia-driver", "package": ["nvidia-*", "libnvidia-*"],
         "pin": "version 580.65.06*", "priority": 1001}
    )  # fmt: skip
    assert m.path(a) == "/etc/apt/preferences.d/nvidia-driver.pref"
    assert m.content(a) == (
        "Package: nvidia-* libnvidia-*\nPin: version 580.65.06*\nPin-Priority: 1001\n"
    )
    obs = m.observe(a, CommandResult("", 0, "exists=0\n", ""))
    conn = ScriptedConnection()
    m.write(conn, a, obs)
    assert conn.stdins == [m.content(a).encode()]


def test_apt_pin_in_place_is_no_change() -> None:
    m = AptPreferences()
    a = m.validate({"name": "p", "pin": "origin mirror.lab", "priority": 600})
    read = stat_block(True, sha(m.content(a).encode()))
    assert m.observe(a, CommandResult("", 0, read, "")).differences == {}


def test_dnf_repo_file_always_checks_signatures() -> None:
    m = DnfRepository()
    a = m.validate(
        {"name": "cuda-rhel9", "baseurl": "https://mirror.lab/cuda/rhel9/x86_64/",
         "gpgkey": "https://mirror.lab/cuda/rhel9/x86_64/D42D0685.pub", "description": "CUDA"}
    )  # fmt: skip
    assert m.path(a) == "/etc/yum.repos.d/cuda-rhel9.repo"
    assert m.content(a) == (
        "[cuda-rhel9]\n"
        "name=CUDA\n"
        "baseurl=https://mirror.lab/cuda/rhel9/x86_64/\n"
        "enabled=1\n"
        "gpgcheck=1\n"
        "repo_gpgcheck=0\n"
        "gpgkey=https://mirror.lab/cuda/rhel9/x86_64/D42D0685.pub\n"
    )


def test_dnf_repo_mode_drift_is_a_difference() -> None:
    m = DnfRepository()
    a = m.validate({"name": "r", "baseurl": "https://m/r/", "gpgkey": "https://m/k"})
    read = stat_block(True, sha(m.content(a).encode()), mode="600")
    assert m.observe(a, CommandResult("", 0, read, "")).differences == {"mode": ("600", "644")}


APT_TOOLS = ("gpg", "dpkg-deb", "dpkg-scanpackages", "apt-get")


@pytest.mark.skipif(
    any(shutil.which(t) is None for t in APT_TOOLS), reason="needs gpg, dpkg-dev and apt"
)
def test_apt_verifies_a_signed_repo_with_the_rendered_source_and_dearmored_key(
    tmp_path: Path,
) -> None:
    """The module's deb822 file, keyring bytes and per-source update command, run by real apt."""
    gnupg, repo, etc = tmp_path / "gnupg", tmp_path / "repo", tmp_path / "etc"
    for d in (gnupg, repo, etc / "sources.list.d", tmp_path / "lists" / "partial"):
        d.mkdir(parents=True)
    gnupg.chmod(0o700)
    env = {**os.environ, "GNUPGHOME": str(gnupg)}

    def sh(*cmd: str, cwd: Path | None = None) -> bytes:
        return subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True).stdout

    sh(
        "gpg",
        "--batch",
        "--passphrase",
        "",
        "--quick-gen-key",
        "lab <l@x>",
        "ed25519",
        "sign",
        "never",
    )
    pkg = tmp_path / "pkg" / "DEBIAN"
    pkg.mkdir(parents=True)
    (pkg / "control").write_text(
        "Package: gpumon-probe\nVersion: 1.0\nArchitecture: all\nMaintainer: l <l@x>\n"
        "Description: probe\n"
    )
    sh("dpkg-deb", "-b", str(pkg.parent), str(repo / "gpumon-probe_1.0_all.deb"))
    packages = sh("dpkg-scanpackages", ".", "/dev/null", cwd=repo)
    (repo / "Packages").write_bytes(packages)
    (repo / "Release").write_text(
        f"Origin: lab\nSuite: ./\nSHA256:\n {sha(packages)} {len(packages)} Packages\n"
    )
    sh("gpg", "--batch", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
    armored = sh("gpg", "--armor", "--export").decode()

    m = AptRepository()
    a = m.validate(
        {"name": "gpumon-probe", "uris": f"file://{repo}/", "suites": "./", "key": armored}
    )
    keyring = tmp_path / "probe.gpg"
    keyring.write_bytes(dearmor(armored.encode()))
    source = m.source_content(a).replace(m.keyring_path(a), str(keyring))
    (etc / m.source_path(a).removeprefix("/etc/apt/")).write_text(source)
    sandbox = (
        f"apt-get -q -o Dir::Etc={etc} -o Dir::State::Lists={tmp_path}/lists "
        f"-o Dir::Cache={tmp_path}/cache"
    )
    update = m.update_command(a).replace("apt-get -q", sandbox)
    ok = subprocess.run(["sh", "-c", update], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert any("_Packages" in p.name for p in (tmp_path / "lists").iterdir()), ok.stdout

    # The same source with some other key must be refused by apt.
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    env["GNUPGHOME"] = str(other)
    sh(
        "gpg",
        "--batch",
        "--passphrase",
        "",
        "--quick-gen-key",
        "x <x@x>",
        "ed25519",
        "sign",
        "never",
    )
    keyring.write_bytes(sh("gpg", "--export"))
    for p in (tmp_path / "lists").glob("*_*"):
        p.unlink()
    bad = subprocess.run(["sh", "-c", update], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "NO_PUBKEY" in bad.stderr
