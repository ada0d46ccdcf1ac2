"""The lab's topology on Vagrant VMs: the files the Vagrantfile uploads to the VMs, and the
inventory written from ``vagrant ssh-config``.

The Vagrantfile (repository root) reads the same topology YAML; ``gpumon-deploy lab mirror``
serves the same offline mirror on the VMs' private network, so the GPU simulation and every
package come from it, as on the nspawn lab.

The inventory reaches every VM on its topology address (the private network, whose machine side
is ``.1``): the address the monitoring stack uses, stable across ``vagrant destroy``/``up``,
where Vagrant's own address (a DHCP lease, or a NAT port on VirtualBox) is not. User and key come
from ``vagrant ssh-config``; commands run through sudo (``ansible_become``).

Host keys: a VM of the lab's box prints its host key fingerprint on its serial console, which
libvirt writes to ``<state>/vagrant/console/<host>.log``; the key a VM offers is checked against
it and pinned in known_hosts, and that host is verified from the first connection. A VM without
such a console line (a public box, VirtualBox) is pinned on first use
(``gpumon_host_key_policy: accept-new``), and its pin is kept while the VM is the same one
(same Vagrant machine id).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.lab.inventory import inventory_data, write_inventory
from deployer.lab.topology import Topology

# ssh-config keys that become inventory connection vars (the address is the topology's).
_CONNECTION = {"user": "ansible_user", "identityfile": "ansible_ssh_private_key_file"}
HOST_KEY_MARK = "gpumon-box host key:"  # deployer/lab/vagrant_box.py prints it at every boot
KEYSCAN_TIMEOUT_S = 20


def parse_ssh_config(text: str, source: str = "vagrant ssh-config") -> dict[str, dict[str, str]]:
    """``Host`` blocks of an OpenSSH client config: ``{host: {lowercased key: value}}``.

    Values keep their first occurrence (as ssh does); quotes around values are removed.
    """
    hosts: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.replace("=", " ", 1).partition(" ")
        key, value = key.lower(), value.strip()
        if key == "host":
            names = shlex.split(value)
            if len(names) != 1:
                raise InputError("expected one name per Host block", source=source, line=number)
            current = hosts.setdefault(names[0], {})
            continue
        if current is None:
            raise InputError(f"{key!r} before any Host line", source=source, line=number)
        if not value:
            raise InputError(f"{key!r} has no value", source=source, line=number, key=key)
        current.setdefault(key, value.strip('"'))
    return hosts


def vagrant_connection(
    topology: Topology, ssh_config: dict[str, dict[str, str]], source: str = "vagrant ssh-config"
) -> dict[str, dict[str, Any]]:
    """Per-host connection vars for every host of the topology: its topology address, port 22,
    and the user and key ``vagrant ssh-config`` names for it."""
    missing = [h.name for h in topology.hosts if h.name not in ssh_config]
    if missing:
        raise InputError(
            f"no ssh-config for {', '.join(missing)} (are those VMs up? `vagrant up`)",
            source=source,
        )
    out: dict[str, dict[str, Any]] = {}
    for h in topology.hosts:
        entry: dict[str, Any] = {"ansible_host": h.address, "ansible_port": 22}
        for key, var in _CONNECTION.items():
            if key in ssh_config[h.name]:
                entry[var] = ssh_config[h.name][key]
        for var, what in (
            ("ansible_user", "User"),
            ("ansible_ssh_private_key_file", "IdentityFile"),
        ):
            if var not in entry:
                raise InputError(f"no {what}", source=source, key=f"{h.name}.{what}")
        if entry["ansible_user"] != "root":
            entry["ansible_become"] = True
        out[h.name] = entry
    return out


def vagrant_inventory(
    topology: Topology,
    ssh_config_text: str,
    *,
    known_hosts: Path,
    mirror: dict[str, str],
    verified: frozenset[str] = frozenset(),
    source: str = "vagrant ssh-config",
) -> dict[str, Any]:
    """The inventory of a Vagrant cluster of this topology.

    Hosts in ``verified`` have their checked host key in ``known_hosts`` and are verified
    (``gpumon_host_key_policy: verify``); every other host says ``accept-new``: its key is
    pinned in ``known_hosts`` on first use and verified from then on.
    """
    conn = vagrant_connection(topology, parse_ssh_config(ssh_config_text, source), source)
    for name, entry in conn.items():
        if name not in verified:
            entry["gpumon_host_key_policy"] = "accept-new"
    data = inventory_data(
        topology,
        private_key=Path("/dev/null"),
        known_hosts=known_hosts,
        mirror=mirror,
        connection=conn,
    )
    all_vars = data["all"]["vars"]
    all_vars["gpumon_host_key_policy"] = "verify"
    # Each VM has its own key and user in ssh-config; no lab-wide defaults apply.
    del all_vars["ansible_ssh_private_key_file"]
    del all_vars["ansible_user"]
    # The VMs boot Debian's kernel; the nvidia_driver role installs its headers as on any host,
    # from the lab's mirror, which carries a stand-in of them for the lab's own box's kernel
    # (vagrant_cluster: mirror.ensure_mirror's box_kernels), so the simulated DKMS builds the
    # driver's module for it. A public box's kernel has none there: its headers task fails,
    # naming the package.
    return data


# ---------------------------------------------------------------- host keys


def console_fingerprints(console_log: Path) -> list[str]:
    """``SHA256:...`` fingerprints the VM printed on its serial console (latest boot last)."""
    try:
        text = console_log.read_text(errors="replace")
    except OSError:
        return []
    pattern = re.escape(HOST_KEY_MARK) + r"\s+\d+\s+(SHA256:[A-Za-z0-9+/]+)"
    return re.findall(pattern, text)


def fingerprint(key_line: str) -> str:
    """OpenSSH's ``SHA256:`` fingerprint of ``type base64 [comment]`` (as ``ssh-keygen -l``)."""
    blob = base64.b64decode(key_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def keyscan(address: str, port: int = 22) -> list[str]:
    """The ed25519 host key ``address`` offers, as ``type base64`` lines (ssh-keyscan)."""
    try:
        proc = subprocess.run(
            ["ssh-keyscan", "-T", "10", "-t", "ed25519", "-p", str(port), address],
            capture_output=True,
            text=True,
            timeout=KEYSCAN_TIMEOUT_S,
            check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#"):
            out.append(f"{fields[1]} {fields[2]}")
    return out


def checked_host_key(name: str, address: str, console_log: Path) -> str | None:
    """The host key ``address`` offers if its fingerprint is the one the VM printed on its
    console (its latest boot); None when the console has none. Raises when they differ."""
    printed = console_fingerprints(console_log)
    if not printed:
        return None
    offered = keyscan(address)
    if not offered:
        raise InputError(f"{name}: no SSH host key could be read from {address}", key=name)
    for key in offered:
        if fingerprint(key) == printed[-1]:
            return key
    raise InputError(
        f"{name}: the host key {address} offers ({fingerprint(offered[0])}) is not the one the "
        f"VM printed on its console ({printed[-1]}, {console_log}): refusing it",
        key=name,
    )


def machine_ids(vagrant_dir: Path, provider: str = "libvirt") -> dict[str, str]:
    """``{machine: id}`` of the VMs Vagrant has created from ``vagrant_dir``'s Vagrantfile."""
    out = {}
    for path in sorted((vagrant_dir / ".vagrant" / "machines").glob(f"*/{provider}/id")):
        out[path.parent.parent.name] = path.read_text().strip()
    return out


def refresh_known_hosts(
    known_hosts: Path,
    topology: Topology,
    checked: dict[str, str],
    ids: dict[str, str],
) -> None:
    """Rewrite ``known_hosts``: every checked key (``{host: "type base64"}``) under the host's
    name and address; a host pinned on first use keeps its pin while its Vagrant machine id
    is the one recorded beside the file (``<known_hosts>.machines.json``)."""
    record = known_hosts.with_name(known_hosts.name + ".machines.json")
    try:
        previous = dict(json.loads(record.read_text()))
    except (OSError, ValueError):
        previous = {}
    try:
        old_lines = known_hosts.read_text().splitlines()
    except OSError:
        old_lines = []
    lines = []
    for h in topology.hosts:
        if h.name in checked:
            lines.append(f"{h.address},{h.name} {checked[h.name]}")
            continue
        if h.name in ids and previous.get(h.name) == ids[h.name]:
            lines += [line for line in old_lines if line.split(" ", 1)[0].split(",")[0] in (
                h.address, h.name)]  # fmt: skip
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    tmp = known_hosts.with_name(known_hosts.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.chmod(0o600)
    tmp.replace(known_hosts)
    record.write_text(json.dumps(ids, indent=2, sort_keys=True))


def run_ssh_config(vagrant_dir: Path) -> str:
    """``vagrant ssh-config`` output for every running VM of the Vagrantfile in ``vagrant_dir``."""
    try:
        proc = subprocess.run(["vagrant", "ssh-config"], cwd=vagrant_dir, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
    except FileNotFoundError as exc:
        raise InputError("vagrant is not installed", source="vagrant") from exc
    if proc.returncode != 0 and not proc.stdout.strip():
        raise InputError(f"vagrant ssh-config failed: {proc.stderr.strip()[-500:]}",
                         source=str(vagrant_dir / "Vagrantfile"))  # fmt: skip
    return proc.stdout


def write_vagrant_inventory(
    topology: Topology,
    ssh_config_text: str,
    out: Path,
    mirror: dict[str, str],
    source: str,
    *,
    console_dir: Path | None = None,
    vagrant_dir: Path | None = None,
) -> Path:
    """Write the inventory (and its known_hosts beside it, host keys checked against the VMs'
    consoles in ``console_dir`` where they printed one). Returns the inventory's path."""
    known_hosts = out.with_name("known_hosts")
    checked: dict[str, str] = {}
    if console_dir is not None:
        for h in topology.hosts:
            key = checked_host_key(h.name, h.address, console_dir / f"{h.name}.log")
            if key is not None:
                checked[h.name] = key
    data = vagrant_inventory(
        topology,
        ssh_config_text,
        known_hosts=known_hosts,
        mirror=mirror,
        verified=frozenset(checked),
        source=source,
    )
    refresh_known_hosts(
        known_hosts, topology, checked, machine_ids(vagrant_dir) if vagrant_dir else {}
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_inventory(
        out,
        data,
        header="# Written by `gpumon-deploy lab vagrant-inventory` from `vagrant ssh-config`.\n",
    )
    return out


def prepare_hardware(topology: Topology, outdir: Path) -> list[Path]:
    """Write, per GPU host, the files gpusim.prepare_root puts into a host's root filesystem
    (``<outdir>/<host>/etc/gpusim/hardware.json`` ...); the Vagrantfile uploads that tree.
    Trees of hosts no longer in the topology are removed."""
    import shutil

    from deployer.lab.lab import gpusim_module

    sim = gpusim_module()
    if sim is None:
        raise InputError("the GPU simulation (deployer.lab.gpusim) is not available")
    wanted = {h.name for h in topology.group("gpu")}
    if outdir.is_dir():
        for old in outdir.iterdir():
            if old.name not in wanted:
                shutil.rmtree(old)
    written = []
    for h in topology.group("gpu"):
        root = outdir / h.name
        root.mkdir(parents=True, exist_ok=True)
        sim.prepare_root(
            root, sim.hardware_for(h.gpu_model, h.gpu_count, h.name, h.nvswitch, mig=h.mig)
        )
        written.append(root)
    return written


def prepare_host_files(outdir: Path) -> Path:
    """The files every lab host gets (``mirror.ensure_host_files``), copied to ``outdir`` for
    the Vagrantfile to upload to every VM."""
    import shutil

    from deployer.lab import mirror

    source = mirror.ensure_host_files()
    if outdir.exists():
        shutil.rmtree(outdir)
    shutil.copytree(source, outdir, ignore=lambda _d, names: [n for n in names if n == ".done"])
    return outdir
