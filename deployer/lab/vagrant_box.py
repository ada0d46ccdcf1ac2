"""A Vagrant box for libvirt built from the lab's own Debian 12 base (no download of a box).

Where no public box can be had (an air-gapped site, or CI machines here), ``gpumon-deploy lab
vagrant-box`` makes one: a copy of the lab's cached debootstrap base (``deployer.lab.base``) with
Debian's kernel and initramfs, the ``vagrant`` user (sudo without a password) and a first-boot
unit that gives every VM its own SSH host key, packed as a libvirt box (``box.img`` qcow2 +
``metadata.json``) and added to Vagrant as ``gpumon-lab/bookworm64``.

Choices, and why:

- **Login key: generated, not Vagrant's well-known insecure key.** The insecure key is a published
  credential: anyone on the VMs' network could log in with it until Vagrant swaps it at the first
  ``vagrant up``. The box's key pair is generated on this machine (ed25519, the private half 0600)
  and never leaves it; the box's own Vagrantfile tells Vagrant to use it
  (``config.ssh.private_key_path``, ``insert_key = false``), so every Vagrantfile using the box
  works unchanged. All VMs of one box share that key (they run on the machine that built it).
- **Direct kernel boot.** The root filesystem is a whole-disk ext4 (``mkfs.ext4 -d``, no
  partition table, no boot loader: nothing needs a loop device), so the box's Vagrantfile boots
  the kernel and initrd shipped beside ``box.img`` (``libvirt.kernel``/``initrd``/``cmd_line``).
- **Host keys per VM**, generated at first boot, and their fingerprint printed on the serial
  console (``gpumon-box host key: ...``), where ``lab vagrant-inventory`` reads it to verify the
  key it is offered.
- **No way out.** The box has no apt source at all; ``eth0`` (Vagrant's management network) takes
  DHCP, and provisioning points apt at the lab's mirror.

The box is cached in ``<cache>/vagrant-box/boxes/<key>/`` and rebuilt only when its inputs change (the
base, the recipe below, the key); a build happens in a staging directory renamed into place when
complete, under a lock, like the base.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.lab import keys
from deployer.lab.base import SUITE, cache_lock, debian_mirror, ensure_base
from deployer.lab.paths import cache_root

BOX_NAME = "gpumon-lab/bookworm64"
BOX_FILE = "gpumon-lab-bookworm64.box"
STAMP = "gpumon-box.json"
KERNEL_PACKAGES: tuple[str, ...] = ("linux-image-amd64", "initramfs-tools")
DISK_GIB = 8
# a kernel release a Debian package name can hold (deb-control(5): lower case, digits, + - .)
_RELEASE = re.compile(r"[a-z0-9][a-z0-9.+~-]*")
# net.ifnames=0: the management NIC is eth0 and the private network eth1, as Vagrant expects.
CMD_LINE = "root=/dev/vda rw console=ttyS0 net.ifnames=0 biosdevname=0 quiet"
HOST_KEY_MARK = "gpumon-box host key:"
RECIPE_VERSION = "3"  # 3: the kernel release recorded in .complete
# Units with nothing to do on a lab VM; each costs minutes of boot under software emulation.
MASKED_UNITS: tuple[str, ...] = ("e2scrub_reap.service", "serial-getty@ttyS0.service")
# The initramfs loads only what a libvirt guest needs to mount its root (a 7 MB initrd instead
# of 36: unpacked by an emulated CPU at every boot).
INITRAMFS_CONF = (
    "# gpumon lab box: only the modules listed in /etc/initramfs-tools/modules\nMODULES=list\n"
)
INITRAMFS_MODULES = "virtio_pci\nvirtio_blk\nvirtio_scsi\next4\n"
BUILD_TIMEOUT_S = 900

BOX_VAGRANTFILE = f"""\
# The gpumon lab's own box (built by `gpumon-deploy lab vagrant-box` from the lab's Debian 12
# base; lab use only). Boots the kernel beside box.img; logs in with the key generated for it.
box_dir = File.expand_path(File.dirname(__FILE__))
Vagrant.configure("2") do |config|
  config.ssh.username = "vagrant"
  config.ssh.private_key_path = [File.join(box_dir, "vagrant_key")]
  config.ssh.insert_key = false
  config.vm.box_check_update = false
  config.vm.provider :libvirt do |lv|
    lv.kernel = File.join(box_dir, "vmlinuz")
    lv.initrd = File.join(box_dir, "initrd.img")
    lv.cmd_line = "{CMD_LINE}"
    lv.disk_bus = "virtio"
  end
end
"""

HOST_KEY_UNIT = f"""\
[Unit]
Description=This VM's own SSH host key (gpumon lab box), fingerprint on the console
Before=ssh.service
DefaultDependencies=no
After=local-fs.target
Wants=local-fs.target

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'test -s /etc/ssh/ssh_host_ed25519_key || ssh-keygen -q -t ed25519 -N "" -C "root@$(hostname)" -f /etc/ssh/ssh_host_ed25519_key; echo "{HOST_KEY_MARK} $(ssh-keygen -l -f /etc/ssh/ssh_host_ed25519_key.pub)" > /dev/console'

[Install]
WantedBy=ssh.service
"""

DHCP_NETWORK = """\
# gpumon lab box: Vagrant's management network (the first NIC) by DHCP. Vagrant writes
# 50-vagrant-eth1.network for the private network. No IPv6 router advertisements.
[Match]
Name=eth0

[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no

[DHCPv4]
# The MAC (unique per VM): a client id derived from the machine id gave two VMs one lease.
ClientIdentifier=mac
"""

SSHD_CONFIG = """\
# gpumon lab box: one host key per VM (made at first boot), keys only, no root login
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""


class BoxBuildError(RuntimeError):
    """Building the box failed; the message carries the failing tool's output."""


@dataclass(frozen=True)
class Box:
    """A built box: the ``.box`` file, its input key and a Vagrant version number."""

    path: Path
    key: str
    version: str
    sha256: str
    built: bool
    seconds: float
    # the kernel release its VMs boot (``vmlinuz-<release>``); None: a box cached before this
    # was recorded
    kernel: str | None = None


def box_cache() -> Path:
    return cache_root() / "vagrant-box"


def login_key() -> tuple[Path, str]:
    """The box's login key pair (generated once per cache): private path, public line."""
    path = box_cache() / "vagrant_key"
    return path, keys.ensure_ed25519(path, "vagrant@gpumon-lab-box")


def box_key(base: Path, public_key: str) -> str:
    """What goes into the box: the base (its directory names its own inputs), the recipe, the
    kernel packages and the login key."""
    material = "\n".join(
        [
            str(base.parent.name),
            RECIPE_VERSION,
            CMD_LINE,
            str(DISK_GIB),
            *KERNEL_PACKAGES,
            BOX_VAGRANTFILE,
            HOST_KEY_UNIT,
            DHCP_NETWORK,
            SSHD_CONFIG,
            *MASKED_UNITS,
            INITRAMFS_CONF,
            INITRAMFS_MODULES,
            public_key.split()[1],
        ]
    )
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def ensure_box(log: Path | None = None) -> Box:
    """The cached box, built first if its inputs changed. Returns it."""
    started = time.monotonic()
    base = ensure_base(log)
    _private, public = login_key()
    key = box_key(base, public)
    boxes = box_cache() / "boxes"
    final = boxes / key
    if (final / ".complete").is_file():
        return _box_at(final, key, built=False, started=started)
    with cache_lock("vagrant-box"):
        if (final / ".complete").is_file():
            return _box_at(final, key, built=False, started=started)
        staging = boxes / f".build-{key}"
        if staging.exists():
            _remove_tree(staging)
        staging.mkdir(parents=True)
        try:
            kernel = _build(base, staging, public, key, log)
            version = f"12.0.{int(time.time())}"
            digest = _sha256(staging / BOX_FILE)
            (staging / ".complete").write_text(
                json.dumps({"key": key, "version": version, "sha256": digest, "kernel": kernel})
            )
        except BaseException:
            _remove_tree(staging)
            raise
        for old in boxes.iterdir():
            if not old.name.startswith(".") and old.name != key:
                _remove_tree(old)  # boxes of older inputs
        if final.exists():
            _remove_tree(final)
        staging.rename(final)
        return _box_at(final, key, built=True, started=started)


def _box_at(directory: Path, key: str, *, built: bool, started: float) -> Box:
    meta = json.loads((directory / ".complete").read_text())
    return Box(
        path=directory / BOX_FILE,
        key=key,
        version=meta["version"],
        sha256=meta["sha256"],
        built=built,
        seconds=time.monotonic() - started,
        kernel=kernel_release(meta.get("kernel")),
    )


def kernel_release(value: Any) -> str | None:
    """A kernel release as a package name may hold it (``linux-headers-<release>``), else
    None."""
    text = str(value or "")
    return text if _RELEASE.fullmatch(text) else None


def _build(base: Path, staging: Path, public_key: str, key: str, log: Path | None) -> str:
    """Build the box into ``staging``; returns the release of the kernel it boots."""
    rootfs = staging / "rootfs"
    _run(["cp", "-a", "--reflink=auto", str(base), str(rootfs)], log, what="copying the base")
    _install_kernel(rootfs, log)
    _configure(rootfs, public_key)
    out = staging / "box"
    out.mkdir()
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise BoxBuildError(f"no kernel or initrd in {rootfs / 'boot'} after installing one")
    shutil.copy2(kernels[-1], out / "vmlinuz")
    shutil.copy2(initrds[-1], out / "initrd.img")
    raw = staging / "root.ext4"
    with open(raw, "wb") as handle:
        handle.truncate(DISK_GIB * 1024**3)
    _run(
        ["mkfs.ext4", "-q", "-F", "-L", "gpumon-root", "-d", str(rootfs), str(raw)],
        log,
        what="mkfs.ext4",
    )
    _remove_tree(rootfs)
    _run(
        ["qemu-img", "convert", "-O", "qcow2", str(raw), str(out / "box.img")],
        log,
        what="qemu-img convert",
    )
    raw.unlink()
    (out / "metadata.json").write_text(
        json.dumps({"provider": "libvirt", "format": "qcow2", "virtual_size": DISK_GIB}) + "\n"
    )
    (out / "Vagrantfile").write_text(BOX_VAGRANTFILE)
    private, _public = login_key()
    shutil.copyfile(private, out / "vagrant_key")
    os.chmod(out / "vagrant_key", 0o600)
    (out / STAMP).write_text(json.dumps({"name": BOX_NAME, "key": key}) + "\n")
    box = staging / BOX_FILE
    names = sorted(p.name for p in out.iterdir())
    _run(["tar", "-cf", str(box), "-C", str(out), *names], log, what="tar")
    os.chmod(box, 0o600)  # it holds the login key
    _remove_tree(out)
    return kernels[-1].name.removeprefix("vmlinuz-")


def _install_kernel(rootfs: Path, log: Path | None) -> None:
    """Debian's kernel and initramfs, installed with apt inside the tree (systemd-nspawn gives
    it /proc and /dev); the downloaded packages are kept in the cache for the next build."""
    archives = box_cache() / "apt-archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    initramfs = rootfs / "etc/initramfs-tools"
    (initramfs / "conf.d").mkdir(parents=True, exist_ok=True)
    (initramfs / "conf.d/gpumon-box.conf").write_text(INITRAMFS_CONF)
    (initramfs / "modules").write_text(INITRAMFS_MODULES)
    sources = rootfs / "etc/apt/sources.list.d/gpumon-box-build.list"
    sources.write_text(f"deb {debian_mirror()} {SUITE} main\n")
    try:
        _run(
            [
                "systemd-nspawn",
                "-q",
                "--register=no",
                "--keep-unit",
                "-D",
                str(rootfs),
                f"--bind={archives}:/var/cache/apt/archives",
                "--setenv=DEBIAN_FRONTEND=noninteractive",
                "/bin/sh",
                "-c",
                "apt-get -q update && apt-get -y -q --no-install-recommends install "
                + " ".join(KERNEL_PACKAGES),
            ],
            log,
            what="installing the kernel",
        )
    finally:
        sources.unlink(missing_ok=True)
        for lists in (rootfs / "var/lib/apt/lists").glob("*_*"):
            lists.unlink()


def _configure(rootfs: Path, public_key: str) -> None:
    _run(
        ["chroot", str(rootfs), "useradd", "--create-home", "--shell", "/bin/bash", "vagrant"],
        None,
        what="useradd vagrant",
    )
    sudoers = rootfs / "etc/sudoers.d/vagrant"
    sudoers.write_text("vagrant ALL=(ALL) NOPASSWD: ALL\n")
    os.chmod(sudoers, 0o440)
    ssh_dir = rootfs / "home/vagrant/.ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "authorized_keys").write_text(public_key.strip() + "\n")
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    _run(
        ["chroot", str(rootfs), "chown", "-R", "vagrant:vagrant", "/home/vagrant/.ssh"],
        None,
        what="chown",
    )
    (rootfs / "etc/ssh/sshd_config.d/gpumon-lab.conf").write_text(SSHD_CONFIG)
    unit = rootfs / "etc/systemd/system/gpumon-box-host-key.service"
    unit.write_text(HOST_KEY_UNIT)
    wants = rootfs / "etc/systemd/system/ssh.service.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / unit.name).unlink(missing_ok=True)
    (wants / unit.name).symlink_to(f"/etc/systemd/system/{unit.name}")
    network = rootfs / "etc/systemd/network/90-gpumon-box-eth0.network"
    network.parent.mkdir(parents=True, exist_ok=True)
    network.write_text(DHCP_NETWORK)
    for name in MASKED_UNITS:
        link = rootfs / "etc/systemd/system" / name
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (rootfs / "etc/fstab").write_text("/dev/vda / ext4 defaults,errors=remount-ro 0 1\n")
    (rootfs / "etc/hostname").write_text("localhost\n")
    (rootfs / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    (rootfs / "etc/machine-id").write_text("")
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()


# ---------------------------------------------------------------- Vagrant's box store


def vagrant_home() -> Path:
    return Path(os.environ.get("VAGRANT_HOME") or Path.home() / ".vagrant.d")


def installed_versions(name: str = BOX_NAME, provider: str = "libvirt") -> dict[str, Path]:
    """``{version: directory}`` of ``name`` in Vagrant's box store, for ``provider``."""
    root = vagrant_home() / "boxes" / name.replace("/", "-VAGRANTSLASH-")
    if not root.is_dir():
        return {}
    return {d.parent.name: d for d in sorted(root.glob(f"*/{provider}")) if d.is_dir()}


def installed_key() -> str | None:
    """The input key of the lab box Vagrant has (None if it has none)."""
    for directory in installed_versions().values():
        try:
            return str(json.loads((directory / STAMP).read_text())["key"])
        except (OSError, ValueError, KeyError):
            continue
    return None


def install(box: Box, env: dict[str, str], log: Path | None = None) -> bool:
    """Add ``box`` to Vagrant (as ``BOX_NAME``, version ``box.version``, its checksum verified
    by Vagrant) unless it has it already; remove other versions. True when it was added."""
    versions = installed_versions()
    if box.version in versions and installed_key() == box.key:
        return False
    catalog = box.path.with_name("catalog.json")
    catalog.write_text(
        json.dumps(
            {
                "name": BOX_NAME,
                "description": "gpumon lab box: Debian 12 from the lab's base (lab use only)",
                "versions": [
                    {
                        "version": box.version,
                        "providers": [
                            {
                                "name": "libvirt",
                                "url": box.path.as_uri(),
                                "checksum_type": "sha256",
                                "checksum": box.sha256,
                            }
                        ],
                    }
                ],
            },
            indent=2,
        )
    )
    _vagrant(["box", "add", "--force", "--provider", "libvirt", str(catalog)], env, log)
    for version in versions:
        if version != box.version:
            _vagrant(
                ["box", "remove", BOX_NAME, "--provider", "libvirt", "--box-version", version,
                 "--force"],
                env,
                log,
            )  # fmt: skip
    for directory in versions.values():
        if directory.parent.is_dir() and not any(directory.parent.iterdir()):
            directory.parent.rmdir()  # the version directory Vagrant leaves empty
    return True


def _vagrant(args: list[str], env: dict[str, str], log: Path | None) -> None:
    try:
        proc = subprocess.run(
            ["vagrant", *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=BUILD_TIMEOUT_S,
            cwd="/",
        )
    except FileNotFoundError as exc:
        raise BoxBuildError("vagrant is not installed (run scripts/setup-vagrant)") from exc
    except subprocess.TimeoutExpired as exc:
        raise BoxBuildError(f"vagrant {args[0]} {args[1]} took over {BUILD_TIMEOUT_S}s") from exc
    if log is not None:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"$ vagrant {' '.join(args)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise BoxBuildError(f"vagrant {' '.join(args[:2])} failed: {proc.stderr.strip()[-1500:]}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _run(cmd: list[str], log: Path | None, *, what: str) -> None:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise BoxBuildError(f"{what} did not finish within {BUILD_TIMEOUT_S}s") from exc
    if log is not None:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise BoxBuildError(f"{what} failed (exit {proc.returncode}): {tail}")


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
