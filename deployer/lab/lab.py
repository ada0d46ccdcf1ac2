"""A lab: a named set of systemd-nspawn hosts on their own bridge, with an offline mirror.

``Lab(name)`` keeps its state in ``<state root>/<name>/`` (see ``deployer.lab.paths``):
``lab.json`` (the topology it runs), ``id_ed25519`` (the root key pair, 0600), ``known_hosts``,
``inventory.yml``, ``mirror.pid`` and ``hosts/<host>/``.  Everything it starts is tracked by PID
and start time; ``down`` ends exactly those processes, unmounts the overlays and deletes the
bridge, and both ``up`` and ``down`` recover from a lab whose processes were killed without a
teardown.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from deployer.errors import HostKeyRefused, HostUnreachable, InputError
from deployer.lab import devnodes, keys, mirror, network, s3
from deployer.lab import host as hostmod
from deployer.lab.base import ensure_base
from deployer.lab.inventory import inventory_data, known_hosts_lines, write_inventory
from deployer.lab.paths import state_root
from deployer.lab.topology import LabHost, Topology, for_lab_name, load_topology

READY_TIMEOUT_S = 150.0
READY_POLL_S = 1.0
SSH_CONNECT_TIMEOUT_S = 3
VETH_GONE_S = 10.0  # the kernel tears a stopped host's veth down within this (network.links_left)
LAB_FAULTS = ("host-down", "partition", "exporter-down")
READY_STATES = ("running", "degraded")
# Every host's systemd takes inotify instances of the machine's root user; Linux's default of
# 128 instances runs out at about 3 labs' worth of hosts ("Too many open files" at boot).
# `lab fault HOST KIND --value V`: the GPU fault parameter that V sets, where it is not "value".
VALUE_PARAMS = {"xid": "xid", "ecc-dbe": "count", "upgrade-validation": "test", "gpu-jobs": "pid"}
INOTIFY_MINIMUMS = {"max_user_instances": 8192, "max_user_watches": 524288}

Echo = Callable[[str], None]


def _stamps(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n == ".done"]


class LabError(RuntimeError):
    """The lab could not be brought up or changed; the message says which host and why."""


def default_topology(name: str = "default", gpu_nodes: int | None = None) -> Topology:
    """The packaged topology, with the network of lab ``name`` (see ``for_lab_name``)."""
    return for_lab_name(load_topology(gpu_nodes=gpu_nodes), name)


class Lab:
    """One lab on this machine. Cheap to construct; nothing happens until a method is called."""

    def __init__(self, name: str = "default", *, echo: Echo | None = None) -> None:
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise InputError("lab names use letters, digits, '-' and '_'", source="--name")
        self.name = name
        self.dir = state_root() / name
        self._echo = echo or (lambda _msg: None)

    # ------------------------------------------------------------ paths and recorded state

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def private_key_path(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def hosts_dir(self) -> Path:
        return self.dir / "hosts"

    def machine(self, host: str) -> str:
        """The systemd-nspawn machine name of ``host`` (names its veth ``vb-<machine>``)."""
        return network.machine_name(self.name, host)

    def host_files(self, host: str) -> hostmod.HostFiles:
        return hostmod.HostFiles(self.hosts_dir / host)

    @property
    def topology(self) -> Topology | None:
        """The topology this lab was last brought up with (None if it is not up)."""
        try:
            return topology_from_dict(json.loads((self.dir / "lab.json").read_text()))
        except (FileNotFoundError, ValueError, KeyError):
            return None

    @property
    def hosts(self) -> list[LabHost]:
        topo = self.topology
        return list(topo.hosts) if topo else []

    def require_topology(self) -> Topology:
        """The lab's topology; a LabError saying to run ``lab up`` when the lab is down."""
        topo = self.topology
        if topo is None:
            raise LabError(f"lab {self.name!r} is not up (run `gpumon-deploy lab up`)")
        return topo

    def mirror_urls(self, topology: Topology | None = None) -> mirror.MirrorUrls:
        topo = topology or self.require_topology()
        return mirror.MirrorUrls(f"http://{topo.gateway}:{topo.mirror_port}")

    def mirror_vars(self, topology: Topology | None = None) -> dict[str, str]:
        urls = self.mirror_urls(topology)
        out = {
            "apt_mirror_url": urls.apt,
            "nvidia_repo_url": urls.nvidia_repo,
            "nvidia_repo_key_url": urls.key,
            "release_mirror_url": urls.releases,
        }
        # The mirror's release archives are repacked Debian binaries: point each role at the
        # version the mirror has (e.g. node_exporter_version: 1.5.0).
        out.update(mirror.release_versions())
        return out

    # ------------------------------------------------------------ up

    def up(
        self, topology: Topology | None = None, *, ready_timeout: float = READY_TIMEOUT_S
    ) -> dict[str, Any]:
        """Bring every host up (idempotent) and wait until each answers SSH with systemd
        running. Returns timings in seconds."""
        started = time.monotonic()
        topology = topology or default_topology(self.name)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        previous = self.topology
        if previous is not None and not changes_in_place(previous, topology):
            self._echo("topology changed: taking the previous lab down first")
            self.down()
            self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "lab.json").write_text(json.dumps(topology_to_dict(topology), indent=2))
        self.hosts_dir.mkdir(exist_ok=True)
        self._clear_leftovers(topology)

        timings: dict[str, float] = {}
        with ThreadPoolExecutor(max_workers=2) as pool:
            base_job = pool.submit(ensure_base, self.dir / "base-build.log")
            mirror_job = pool.submit(mirror.ensure_mirror, self.dir / "mirror-build.log")
            base = base_job.result()
            timings["base"] = time.monotonic() - started
            mirror_job.result()
            timings["mirror"] = time.monotonic() - started
        raise_inotify_limits()
        network.ensure_bridge(topology)
        mirror.serve(
            topology.gateway, topology.mirror_port, self.dir / "mirror.pid", self.dir / "mirror.log"
        )
        s3_vars = self._start_s3(topology)
        authorized = self._client_key()
        apt_key = mirror.public_key()
        wanted = {h.name for h in topology.hosts}
        keys = {name: key for name, key in self._host_keys().items() if name in wanted}
        to_start = [h for h in topology.hosts if not hostmod.running(self.host_files(h.name))]
        for name in [h.name for h in to_start]:
            keys.pop(name, None)

        host_files = mirror.ensure_host_files()
        for h in topology.hosts:
            merged = self.host_files(h.name).merged
            if h not in to_start and hostmod.is_mounted(merged):
                # Running hosts get files added to the lab since they started, and the names of
                # hosts added beside them.
                shutil.copytree(host_files, merged, dirs_exist_ok=True, ignore=_stamps)
                hostmod.write_hosts_file(merged, h, topology)

        def start(h: LabHost) -> tuple[str, str]:
            files = self.host_files(h.name)
            hostmod.mount_overlay(files, base)
            pub = hostmod.write_identity(
                files.merged,
                h,
                topology,
                authorized,
                self.mirror_urls(topology).apt_sources(),
                apt_key,
            )
            shutil.copytree(host_files, files.merged, dirs_exist_ok=True, ignore=_stamps)
            extra = self._gpu_prepare(h, files)
            hostmod.start_supervisor(
                files, hostmod.nspawn_command(files, self.machine(h.name), topology, extra)
            )
            return h.name, pub

        machines = [self.machine(h.name) for h in topology.hosts]
        if len(set(machines)) != len(machines):
            raise LabError(f"host names of lab {self.name!r} shorten to the same machine name")
        # A lab taken down a moment ago may still be losing its links (network.links_left).
        veths = {network.host_veth(self.machine(h.name)): self.machine(h.name) for h in to_start}
        taken = network.links_left(list(veths), VETH_GONE_S)
        if taken:
            raise LabError(
                f"{taken[0]} already exists: another lab runs a host as machine "
                f"{veths[taken[0]]}; take that lab down first"
            )
        if to_start:
            self._echo(f"starting {', '.join(h.name for h in to_start)}")
        with ThreadPoolExecutor(max_workers=max(1, len(to_start))) as pool:
            for name, pub in pool.map(start, to_start):
                keys[name] = pub
        self._write_host_keys(keys)
        self._write_access_files(topology, keys, s3_vars)
        timings["started"] = time.monotonic() - started
        self.wait_ready([h.name for h in topology.hosts], timeout=ready_timeout)
        timings["ready"] = time.monotonic() - started
        self._echo(
            f"lab {self.name!r} up: {len(topology.hosts)} hosts ready in "
            f"{timings['ready']:.1f}s; inventory {self.inventory_path}"
        )
        return timings

    def _clear_leftovers(self, topology: Topology) -> None:
        """Remove hosts that are not running (killed without teardown) or not in the topology."""
        wanted = {h.name for h in topology.hosts}
        for files in self._host_dirs():
            name = files.dir.name
            if name in wanted and hostmod.running(files):
                continue
            tree = hostmod.request_stop(files)
            hostmod.finish_stop(files, tree, hostmod.GRACEFUL_STOP_S)
            hostmod.remove(files)

    def _host_dirs(self) -> list[hostmod.HostFiles]:
        if not self.hosts_dir.is_dir():
            return []
        return [hostmod.HostFiles(p) for p in sorted(self.hosts_dir.iterdir()) if p.is_dir()]

    def _client_key(self) -> str:
        return keys.ensure_ed25519(self.private_key_path, f"gpumon-lab-{self.name}")

    def _host_keys(self) -> dict[str, str]:
        try:
            return dict(json.loads((self.dir / "host_keys.json").read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    def _write_host_keys(self, keys: dict[str, str]) -> None:
        (self.dir / "host_keys.json").write_text(json.dumps(keys, indent=2, sort_keys=True))

    def _write_access_files(
        self, topology: Topology, keys: dict[str, str], s3_vars: dict[str, str]
    ) -> None:
        entries = {
            h.name: ([h.name, h.address], keys[h.name]) for h in topology.hosts if h.name in keys
        }
        self.known_hosts_path.write_text(known_hosts_lines(entries))
        write_inventory(
            self.inventory_path,
            inventory_data(
                topology,
                private_key=self.private_key_path,
                known_hosts=self.known_hosts_path,
                mirror={**self.mirror_vars(topology), **s3_vars},
            ),
        )

    def _start_s3(self, topology: Topology) -> dict[str, str]:
        """The S3 server for the store's backups (deployer/lab/s3.py); its inventory vars."""
        if not topology.group("metrics_store"):
            s3.shutdown(self.dir)
            return {}
        if not s3.available():
            self._echo("moto[server] is not installed: no S3 server, backups not configured")
            return {}
        return s3.start(self.dir, topology.gateway)

    def _gpu_prepare(self, h: LabHost, files: hostmod.HostFiles) -> list[str]:
        if h.is_gpu:
            devnodes.prepare_root(files.merged, h.gpu_count)
        sim = gpusim_module()
        if not h.is_gpu or sim is None:
            return []
        hardware = sim.hardware_for(h.gpu_model, h.gpu_count, h.name, h.nvswitch, mig=h.mig)
        sim.prepare_root(files.merged, hardware)
        # The host's PCI bus (a nspawn host sees the machine's own sysfs); not on the Vagrant
        # tier, whose VMs get the hardware tree without units (vagrant.prepare_hardware)
        from deployer.lab.gpusim import pci

        pci.prepare_root(files.merged, hardware)
        return list(sim.nspawn_args(files.dir))

    # ------------------------------------------------------------ readiness and SSH

    def ssh(
        self,
        host: str,
        command: str,
        *,
        timeout: float = 60.0,
        input: str | None = None,
        connect_timeout: int = SSH_CONNECT_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host`` as root over SSH, host key checked against the lab's
        known_hosts. Never raises for a failing command; see ``returncode``."""
        h = self.require_topology().host(host)
        base = ssh_command(h.address, self.private_key_path, self.known_hosts_path, connect_timeout)
        cmd = [*base, command]
        try:
            return subprocess.run(
                cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(
                cmd, 124, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)"
            )

    def wait_ready(self, hosts: list[str], *, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait (bounded) until every host answers SSH and systemd is running or degraded."""
        topo = self.require_topology()
        deadline = time.monotonic() + timeout

        def one(name: str) -> str | None:
            h = topo.host(name)
            last = "no answer yet"
            for _ in range(int(timeout / READY_POLL_S) + 1):
                if time.monotonic() > deadline:
                    break
                if not hostmod.running(self.host_files(name)):
                    return f"{name}: its systemd-nspawn exited; see {self.host_files(name).console}"
                if _port_open(h.address, 22):
                    proc = self.ssh(name, "systemctl is-system-running", timeout=15)
                    state = proc.stdout.strip()
                    if "Host key verification failed" in proc.stderr:
                        raise HostKeyRefused(
                            f"{name}: host key does not match the lab's "
                            f"known_hosts ({self.known_hosts_path})"
                        )
                    if state in READY_STATES:
                        return None
                    last = state or proc.stderr.strip()[-200:]
                time.sleep(READY_POLL_S)
            return f"{name}: not ready after {timeout:.0f}s ({last})"

        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            problems = [p for p in pool.map(one, hosts) if p]
        if problems:
            raise HostUnreachable("; ".join(problems))

    # ------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """What runs now: per host its process, link, faults and boots; the mirror; the bridge."""
        topo = self.topology
        out: dict[str, Any] = {
            "name": self.name,
            "up": topo is not None,
            "hosts": {},
            "state_dir": str(self.dir),
        }
        if topo is None:
            return out
        sim = gpusim_module()
        out["bridge"] = {
            "name": topo.bridge,
            "exists": network.link_exists(topo.bridge),
            "address": f"{topo.gateway}/{topo.prefixlen}",
        }
        server = mirror.procs.load(self.dir / "mirror.pid")
        out["mirror"] = {
            "url": self.mirror_urls(topo).base,
            "serving": bool(server and server.alive()),
            "gpu_simulation": "available" if sim else "not built (no gpusim)",
        }
        out["s3"] = dict(s3.status(self.dir, topo.gateway))
        for h in topo.hosts:
            files = self.host_files(h.name)
            out["hosts"][h.name] = {
                "address": h.address,
                "groups": list(h.groups),
                "running": hostmod.running(files),
                "link_up": network.link_is_up(self.machine(h.name)),
                "boots": hostmod.boots(files),
                "faults": self.faults(h.name),
                **({"gpus": _gpus_text(h)} if h.is_gpu else {}),
            }
        out["inventory"] = str(self.inventory_path)
        return out

    # ------------------------------------------------------------ faults

    def fault_kinds(self) -> tuple[str, ...]:
        sim = gpusim_module()
        return LAB_FAULTS + (tuple(sim.FAULT_KINDS) if sim else ())

    def faults(self, host: str) -> list[dict[str, Any]]:
        try:
            return list(json.loads((self.host_files(host).dir / "faults.json").read_text()))
        except (FileNotFoundError, ValueError):
            return []

    def _record_fault(self, host: str, kind: str, params: dict[str, Any]) -> None:
        faults = [f for f in self.faults(host) if f["kind"] != kind]
        faults.append({"kind": kind, "params": params})
        (self.host_files(host).dir / "faults.json").write_text(json.dumps(faults, indent=2))

    def fault(self, host: str, kind: str, **params: Any) -> None:
        """Inject one fault into ``host`` (see ``fault_kinds``); ``heal`` undoes all of them."""
        topo = self.require_topology()
        h = topo.host(host)
        files = self.host_files(host)
        params = {k: v for k, v in params.items() if v is not None}
        sim = gpusim_module()
        if kind == "host-down":
            hostmod.power_off(files)
        elif kind == "partition":
            if not network.set_link(self.machine(host), up=False):
                raise LabError(f"{host} has no link to cut (is it running?)")
        elif kind == "exporter-down":
            params["units"] = self._stop_exporters(host)
        elif sim is not None and kind in sim.FAULT_KINDS:
            if not h.is_gpu:
                raise InputError(f"{kind} needs a GPU host; {host} has no GPUs", key=kind)
            if "value" in params and kind in VALUE_PARAMS:
                params[VALUE_PARAMS[kind]] = params.pop("value")
            sim.apply_fault(files.merged, kind, params)
        else:
            raise InputError(
                f"unknown fault kind {kind!r} (kinds: {', '.join(self.fault_kinds())})", key=kind
            )
        self._record_fault(host, kind, params)
        self._echo(f"{host}: fault {kind} injected")

    def heal(self, host: str, *, ready_timeout: float = READY_TIMEOUT_S) -> None:
        """Undo every fault on ``host``: power it on, reconnect it, restore its GPUs and
        exporter, and wait until it is ready again."""
        topo = self.require_topology()
        h = topo.host(host)
        files = self.host_files(host)
        if not hostmod.running(files):
            base = ensure_base()
            hostmod.mount_overlay(files, base)
            extra = self._gpu_prepare_args(h, files)
            hostmod.start_supervisor(
                files, hostmod.nspawn_command(files, self.machine(host), topo, extra)
            )
        sim = gpusim_module()
        if h.is_gpu and sim is not None:
            sim.heal(files.merged)
        self._reconnect(host)
        self.wait_ready([host], timeout=ready_timeout)
        stopped = [
            u
            for f in self.faults(host)
            if f["kind"] == "exporter-down"
            for u in f["params"].get("units", [])
        ]
        if stopped:
            proc = self.ssh(host, "systemctl start " + " ".join(stopped))
            if proc.returncode != 0:
                raise LabError(f"{host}: starting {' '.join(stopped)} failed: {proc.stderr}")
        (files.dir / "faults.json").unlink(missing_ok=True)
        self._echo(f"{host}: healed")

    def _stop_exporters(self, host: str) -> list[str]:
        """Stop every running dcgm-exporter unit (``dcgm-exporter.service`` as the product
        installs it, ``nvidia-dcgm-exporter.service`` from the CUDA repository's package)."""
        proc = self.ssh(
            host,
            "systemctl list-units --type=service --state=active --plain --no-legend "
            "'*dcgm-exporter*' | awk '{print $1}'",
        )
        units = proc.stdout.split()
        if proc.returncode != 0 or not units:
            raise LabError(f"{host}: no running dcgm-exporter service to stop {proc.stderr}")
        stop = self.ssh(host, "systemctl stop " + " ".join(units))
        if stop.returncode != 0:
            raise LabError(f"{host}: stopping {' '.join(units)} failed: {stop.stderr.strip()}")
        return units

    def _reconnect(self, host: str) -> None:
        for _ in range(50):
            if network.set_link(self.machine(host), up=True):
                return
            time.sleep(0.2)  # a just-started host's veth appears within a moment

    def _gpu_prepare_args(self, h: LabHost, files: hostmod.HostFiles) -> list[str]:
        sim = gpusim_module()
        return list(sim.nspawn_args(files.dir)) if h.is_gpu and sim is not None else []

    def reboot(self, host: str, *, ready_timeout: float = READY_TIMEOUT_S) -> None:
        """``systemctl reboot`` inside the host and wait until it is back (a new boot)."""
        files = self.host_files(host)
        before = hostmod.boots(files)
        self.ssh(host, "systemctl reboot", timeout=15)
        deadline = time.monotonic() + ready_timeout
        for _ in range(int(ready_timeout / 0.2)):
            now = hostmod.boots(files)
            if now > before or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.wait_ready([host], timeout=max(1.0, deadline - time.monotonic()))

    # ------------------------------------------------------------ down

    def down(self) -> None:
        """Stop every host (cleanly, then by force), unmount, stop the mirror, delete the
        bridge and the lab's runtime files. Safe on a lab that was killed without teardown."""
        topo = self.topology
        dirs = self._host_dirs()
        trees = [(files, hostmod.request_stop(files)) for files in dirs]
        for files, tree in trees:
            hostmod.finish_stop(files, tree, hostmod.GRACEFUL_STOP_S)
        # Return only once the hosts' veths are gone, so that a lab brought up right after with
        # the same machine names does not find them; one the kernel keeps is deleted.
        veths = [network.host_veth(self.machine(files.dir.name)) for files in dirs]
        for veth in network.links_left(veths, VETH_GONE_S):
            network.delete_link(veth)
        for files in dirs:
            hostmod.remove(files)
        mirror.stop_serving(self.dir / "mirror.pid")
        s3.shutdown(self.dir)
        if topo is not None:
            network.delete_bridge(topo.bridge)
        for name in ("inventory.yml", "known_hosts", "host_keys.json", "lab.json", "slurm.json"):
            (self.dir / name).unlink(missing_ok=True)
        if self.hosts_dir.is_dir():
            shutil.rmtree(self.hosts_dir)
        self._echo(f"lab {self.name!r} down")


# ---------------------------------------------------------------- helpers


def _gpus_text(h: LabHost) -> str:
    mig = f", MIG on GPU {','.join(map(str, h.mig_gpus))}" if h.mig_gpus else ""
    return f"{h.gpu_count}x{h.gpu_model} (simulated{mig})"


def gpusim_module() -> Any:
    """The GPU simulation package when it provides the contract's API, else None."""
    try:
        from deployer.lab import gpusim
    except ImportError:
        return None
    needed = (
        "build_packages",
        "hardware_for",
        "prepare_root",
        "nspawn_args",
        "FAULT_KINDS",
        "apply_fault",
        "heal",
    )
    return gpusim if all(hasattr(gpusim, n) for n in needed) else None


def raise_inotify_limits() -> None:
    """Raise (never lower) the machine's inotify limits to ``INOTIFY_MINIMUMS``."""
    for name, minimum in INOTIFY_MINIMUMS.items():
        path = Path("/proc/sys/fs/inotify") / name
        try:
            if int(path.read_text()) < minimum:
                path.write_text(f"{minimum}\n")
        except (OSError, ValueError):
            continue


def ssh_command(address: str, key: Path, known_hosts: Path, connect_timeout: int) -> list[str]:
    return [
        "ssh",
        "-i",
        str(key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=2",
        f"root@{address}",
    ]


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def changes_in_place(previous: Topology, wanted: Topology) -> bool:
    """True when the lab can go from ``previous`` to ``wanted`` without touching the hosts both
    have: the same network and mirror, and every host kept exactly as it was (name, address,
    groups, GPUs, variables). Hosts are then only added or removed; a running host keeps its
    state (driver, packages, data) and is not restarted. Anything else takes the lab down first."""
    before, after = topology_to_dict(previous), topology_to_dict(wanted)
    hosts_before = {h["name"]: h for h in before.pop("hosts")}
    hosts_after = {h["name"]: h for h in after.pop("hosts")}
    before.pop("source")  # the file it was read from says nothing about the hosts
    after.pop("source")
    if before != after:
        return False
    kept = hosts_before.keys() & hosts_after.keys()
    if any(hosts_before[name] != hosts_after[name] for name in kept):
        return False
    # An address given up by a removed host and taken by an added one is a different machine
    # behind the same address: known_hosts and ARP caches would say otherwise. Start over.
    removed = {hosts_before[n]["address"] for n in hosts_before.keys() - kept}
    added = {hosts_after[n]["address"] for n in hosts_after.keys() - kept}
    return not removed & added


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    out: dict[str, Any] = {
        "bridge": topology.bridge,
        "subnet": str(topology.subnet),
        "mirror_port": topology.mirror_port,
        "source": topology.source,
        "hosts": [
            {
                "name": h.name,
                "groups": list(h.groups),
                "address": h.address,
                "gpu_model": h.gpu_model,
                "gpu_count": h.gpu_count,
                "nvswitch": h.nvswitch,
                "mig": h.mig,
                "vars": h.vars,
            }
            for h in topology.hosts
        ],
    }
    if topology.slurm_controller:
        out["slurm"] = {"controller": topology.slurm_controller}
    return out


def topology_from_dict(data: dict[str, Any]) -> Topology:
    return Topology(
        bridge=data["bridge"],
        subnet=ipaddress.IPv4Network(data["subnet"]),
        mirror_port=int(data["mirror_port"]),
        source=data.get("source", "<lab.json>"),
        hosts=tuple(
            LabHost(
                name=h["name"],
                groups=tuple(h["groups"]),
                address=h["address"],
                gpu_model=h.get("gpu_model"),
                gpu_count=int(h.get("gpu_count") or 0),
                nvswitch=bool(h.get("nvswitch")),
                vars=dict(h.get("vars") or {}),
                mig=h.get("mig"),
            )
            for h in data["hosts"]
        ),
        slurm_controller=(data.get("slurm") or {}).get("controller"),
    )
