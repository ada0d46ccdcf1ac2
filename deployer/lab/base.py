"""The lab's base root filesystem: one Debian 12 tree built with debootstrap, cached and shared.

Every lab host boots from an overlay on top of this tree, so the tree itself is never written
after it is built.  It is keyed by suite, mirror and package list, built into a temporary
directory and renamed into place only when complete, under a lock, so a killed build leaves
nothing that a later run would mistake for a finished base.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deployer.lab.paths import cache_root

SUITE = "bookworm"
BASE_PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "openssh-server",
    "python3",
    "iproute2",
    "dbus",
    "apt",
    "ca-certificates",
    "sudo",
    "curl",
    "gnupg",
    "procps",
    "kmod",
    "iputils-ping",
)
MIRROR_ENV = "GPUMON_LAB_DEBIAN_MIRROR"
FALLBACK_MIRROR = "http://deb.debian.org/debian"
# Units that have nothing to do inside a container and would only mark the system degraded.
MASKED_UNITS: tuple[str, ...] = (
    "systemd-networkd-wait-online.service",
    "systemd-network-generator.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
)


class BaseBuildError(RuntimeError):
    """debootstrap or the base's preparation failed; the message carries the tool's output."""


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (``$GPUMON_LAB_DEBIAN_MIRROR`` overrides)."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override.rstrip("/")
    return mirror_from_apt_sources(Path("/etc/apt")) or FALLBACK_MIRROR


def mirror_from_apt_sources(apt_dir: Path) -> str | None:
    """First non-security Debian URI in ``sources.list`` or ``sources.list.d`` (both formats)."""
    files: list[Path] = []
    if (apt_dir / "sources.list").is_file():
        files.append(apt_dir / "sources.list")
    listing = apt_dir / "sources.list.d"
    if listing.is_dir():
        files += sorted(p for p in listing.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for uri, suites in _apt_entries(text, deb822=path.suffix == ".sources"):
            if "security" in uri or SUITE not in suites:
                continue
            return uri.rstrip("/")
    return None


def _apt_entries(text: str, *, deb822: bool) -> Iterator[tuple[str, list[str]]]:
    if not deb822:
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line.startswith("deb "):
                continue
            line = re.sub(r"\[[^\]]*\]", " ", line)
            fields = line.split()
            if len(fields) >= 3:
                yield fields[1], [fields[2]]
        return
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith("#") or ":" not in raw:
                continue
            key, _, value = raw.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled") == "no":
            continue
        suites = fields.get("suites", "").split()
        for uri in fields.get("uris", "").split():
            yield uri, suites


def base_key(mirror: str, packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    """Cache key of a base tree: what went into it, so a changed package list builds anew."""
    material = "\n".join([SUITE, mirror, *sorted(packages), *MASKED_UNITS, "v2"])
    return hashlib.sha256(material.encode()).hexdigest()[:12]


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """An exclusive flock on ``<cache>/<name>.lock`` (released when the process dies)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_base(log: Path | None = None) -> Path:
    """The cached base root filesystem, built first if missing. Returns its directory."""
    mirror = debian_mirror()
    parent = cache_root() / "base"
    final = parent / f"{SUITE}-{base_key(mirror)}"
    if (final / ".complete").is_file():
        return final / "rootfs"
    with cache_lock("base"):
        if (final / ".complete").is_file():
            return final / "rootfs"
        parent.mkdir(parents=True, exist_ok=True)
        staging = parent / f".build-{final.name}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        rootfs = staging / "rootfs"
        started = time.monotonic()
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            log,
            what="debootstrap",
        )
        _prepare_base(rootfs)
        (staging / ".complete").write_text(f"built in {time.monotonic() - started:.0f}s\n")
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
        return final / "rootfs"


def _prepare_base(rootfs: Path) -> None:
    """Make the tree a bootable, network-silent template with no identity of its own."""
    _run(["chroot", str(rootfs), "systemctl", "enable", "systemd-networkd"], None, what="enable")
    for unit in MASKED_UNITS:
        link = rootfs / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # No source points outside the lab; each host gets the lab mirror at preparation time.
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/machine-id").write_text("")
    (rootfs / "etc/hostname").write_text("localhost\n")
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for lists in (rootfs / "var/lib/apt/lists").glob("*_*"):
        lists.unlink()
    sshd_dropin = rootfs / "etc/ssh/sshd_config.d/gpumon-lab.conf"
    sshd_dropin.parent.mkdir(parents=True, exist_ok=True)
    sshd_dropin.write_text(
        "# gpumon lab: each host has one host key, generated for it when the lab creates it\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\n"
        "UseDNS no\n"
    )


def _run(cmd: list[str], log: Path | None, *, what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if log is not None:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise BaseBuildError(f"{what} failed (exit {proc.returncode}): {tail}")
