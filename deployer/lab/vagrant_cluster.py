"""A Vagrant cluster of a lab topology on libvirt, up and down in one command each.

``gpumon-deploy lab vagrant-up`` runs what README.md's "Vagrant clusters" lists by hand:
libvirt answering (started here, and stopped again by ``vagrant-down``, where the machine has no
systemd), the box (the lab's own box where no public one is installed), the mirror and the files
the VMs get, ``vagrant up --no-provision``, the mirror served on the VMs' private network,
``vagrant provision``, the inventory. ``vagrant-down`` destroys the VMs and then removes what
libvirt would keep: the box's volume and the lab's storage pool, the networks the VMs used, and
the daemons it started. Every step is bounded in time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.lab import libvirtd, mirror
from deployer.lab.paths import state_root
from deployer.lab.topology import Topology, load_topology

REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLIC_BOX = "debian/bookworm64"
POOL = "gpumon-lab"
MANAGEMENT_NETWORK = "gpumon-lab-mgmt"
UP_TIMEOUT_S = 1800
PROVISION_TIMEOUT_S = 900
DESTROY_TIMEOUT_S = 600
VAGRANT_TIMEOUT_S = 300

Echo = Callable[[str], None]


class VagrantError(RuntimeError):
    """A vagrant command failed or timed out; the message has the end of its output."""


def vagrant_state() -> Path:
    """Where Vagrant clusters of the lab keep their files (the Vagrantfile reads the same)."""
    return state_root() / "vagrant"


def default_vagrant_dir() -> Path:
    """The directory of the product's Vagrantfile (the repository root), else the current one."""
    return REPO_ROOT if (REPO_ROOT / "Vagrantfile").is_file() else Path.cwd()


@dataclass
class VagrantCluster:
    """The VMs of one topology from the Vagrantfile in ``vagrant_dir``, on libvirt."""

    topology_file: Path
    vagrant_dir: Path = field(default_factory=default_vagrant_dir)
    driver: str = "kvm"
    box: str = "auto"
    echo: Echo = field(default=lambda _msg: None)

    @property
    def state(self) -> Path:
        return vagrant_state()

    @property
    def topology(self) -> Topology:
        return load_topology(self.topology_file)

    @property
    def inventory_path(self) -> Path:
        return self.state / "inventory.yml"

    @property
    def log(self) -> Path:
        return self.state / "vagrant.log"

    def env(self, box: str | None = None) -> dict[str, str]:
        env = {
            **os.environ,
            "VAGRANT_CHECKPOINT_DISABLE": "1",  # no version check call to HashiCorp
            "VAGRANT_DEFAULT_PROVIDER": "libvirt",
            "GPUMON_LAB_TOPOLOGY": str(self.topology_file.resolve()),
            "GPUMON_LIBVIRT_DRIVER": self.driver,
            "GPUMON_LAB_STATE_DIR": str(state_root()),
            "GPUMON_LIBVIRT_POOL": POOL,
        }
        if box is not None:
            env["GPUMON_VAGRANT_BOX"] = box
        return env

    def vagrant(
        self, *args: str, timeout: float = VAGRANT_TIMEOUT_S, box: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``vagrant ARGS`` in the Vagrantfile's directory, output appended to the log."""
        self.state.mkdir(parents=True, exist_ok=True)
        cmd = ["vagrant", *args]
        try:
            with open(self.log, "a", encoding="utf-8") as log:
                log.write(f"\n$ {' '.join(cmd)}\n")
                log.flush()
                proc = subprocess.run(
                    cmd,
                    cwd=self.vagrant_dir,
                    env=self.env(box),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    check=False,
                )
        except FileNotFoundError as exc:
            raise VagrantError("vagrant is not installed (run scripts/setup-vagrant)") from exc
        except subprocess.TimeoutExpired as exc:
            raise VagrantError(
                f"`vagrant {' '.join(args)}` did not finish within {timeout:g}s; "
                f"see {self.log}:\n{self._log_tail()}"
            ) from exc
        return subprocess.CompletedProcess(cmd, proc.returncode, "", "")

    def _checked(self, *args: str, timeout: float, box: str | None = None) -> None:
        if self.vagrant(*args, timeout=timeout, box=box).returncode != 0:
            raise VagrantError(f"`vagrant {' '.join(args)}` failed; see {self.log}:\n"
                               f"{self._log_tail()}")  # fmt: skip

    def _log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------------------ up

    def choose_box(self) -> str:
        """The box name to use: ``lab``, ``public`` or a name; ``auto`` takes the public box
        when Vagrant has it for libvirt and the lab's own box otherwise (as the Vagrantfile)."""
        from deployer.lab import vagrant_box

        if self.box == "lab":
            return vagrant_box.BOX_NAME
        if self.box == "public":
            return PUBLIC_BOX
        if self.box != "auto":
            return self.box
        if vagrant_box.installed_versions(PUBLIC_BOX):
            return PUBLIC_BOX
        return vagrant_box.BOX_NAME

    def up(self) -> dict[str, Any]:
        """Bring the cluster up and write its inventory. Returns timings (seconds) and paths."""
        from deployer.lab import vagrant_box
        from deployer.lab.vagrant import (
            prepare_hardware,
            prepare_host_files,
            write_vagrant_inventory,
        )

        started = time.monotonic()
        timings: dict[str, Any] = {}
        topology = self.topology
        self.state.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state, 0o700)
        if self.log.exists():
            self.log.replace(self.log.with_name(self.log.name + ".1"))  # one run per log
        if libvirtd.ensure_running(self.state):
            self.echo("libvirtd and virtlogd started (no systemd here); vagrant-down stops them")
        timings["libvirt"] = time.monotonic() - started
        box = self.choose_box()
        box_kernels: tuple[str, ...] = ()
        if box == vagrant_box.BOX_NAME:
            built = vagrant_box.ensure_box(self.state / "box-build.log")
            self.echo(f"box {built.path} ({'built' if built.built else 'cached'})")
            if vagrant_box.install(built, self.env(), self.log):
                self.echo(f"box added to Vagrant as {vagrant_box.BOX_NAME} {built.version}")
            # the mirror carries that kernel's headers' stand-in: the driver role installs it
            # and the simulated DKMS builds the driver's module for the VMs' kernel
            box_kernels = (built.kernel,) if built.kernel else ()
        timings["box"] = time.monotonic() - started
        mirror.ensure_mirror(self.state / "mirror-build.log", box_kernels)
        prepare_hardware(topology, self.state / "hardware")
        prepare_host_files(self.state / "host-files")
        console = self.state / "console"
        console.mkdir(exist_ok=True)
        self._ensure_pool()
        timings["prepared"] = time.monotonic() - started
        self.echo(f"vagrant up ({', '.join(h.name for h in topology.hosts)}; {self.driver})")
        self._checked("up", "--no-provision", "--provider", "libvirt", timeout=UP_TIMEOUT_S,
                      box=box)  # fmt: skip
        timings["vms_up"] = time.monotonic() - started
        mirror.serve(
            topology.gateway, topology.mirror_port, self.state / "mirror.pid",
            self.state / "mirror.log",
        )  # fmt: skip
        # One vagrant per VM, at once (Vagrant itself provisions one VM after the other).
        with ThreadPoolExecutor(max_workers=len(topology.hosts)) as pool:
            jobs = [
                pool.submit(
                    self._checked, "provision", h.name, timeout=PROVISION_TIMEOUT_S, box=box
                )
                for h in topology.hosts
            ]
            for job in jobs:
                job.result()
        timings["provisioned"] = time.monotonic() - started
        ssh_config = self.vagrant_ssh_config(box)
        write_vagrant_inventory(
            topology,
            ssh_config,
            self.inventory_path,
            mirror_vars(topology),
            "vagrant ssh-config",
            console_dir=console,
            vagrant_dir=self.vagrant_dir,
        )
        timings["inventory"] = time.monotonic() - started
        self.echo(f"Vagrant cluster up in {timings['inventory']:.0f}s; inventory "
                  f"{self.inventory_path}")  # fmt: skip
        return {
            "seconds": {k: round(v, 1) for k, v in timings.items()},
            "box": box,
            "inventory": str(self.inventory_path),
        }

    def vagrant_ssh_config(self, box: str | None = None) -> str:
        cmd = ["vagrant", "ssh-config"]
        try:
            proc = subprocess.run(cmd, cwd=self.vagrant_dir, env=self.env(box),
                                  capture_output=True, text=True, timeout=VAGRANT_TIMEOUT_S,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise VagrantError(f"vagrant ssh-config took over {VAGRANT_TIMEOUT_S}s") from exc
        if proc.returncode != 0:
            raise VagrantError(f"vagrant ssh-config failed: {proc.stderr.strip()[-800:]}")
        return proc.stdout

    def _ensure_pool(self) -> None:
        """The lab's own storage pool (its volumes are all the lab's), under the state dir."""
        names = libvirtd.virsh("pool-list", "--all", "--name").split()
        path = self.state / "pool"
        path.mkdir(exist_ok=True)
        if POOL not in names:
            libvirtd.virsh("pool-define-as", POOL, "dir", "--target", str(path))
        info = libvirtd.virsh("pool-info", POOL)
        if "running" not in info:
            libvirtd.virsh("pool-start", POOL)

    # ------------------------------------------------------------ down

    def down(self) -> dict[str, Any]:
        """Destroy the VMs and everything libvirt kept for them; stop the daemons started by
        ``up``. Safe to run on a cluster that is half up, or not up at all."""
        started = time.monotonic()
        removed: dict[str, Any] = {}
        if libvirtd.responds() or (self.vagrant_dir / ".vagrant" / "machines").is_dir():
            # Destroying needs libvirt; start it again if a killed run left VMs behind.
            libvirtd.ensure_running(self.state)
        mirror.stop_serving(self.state / "mirror.pid")
        try:
            if libvirtd.responds():
                self._checked("destroy", "--force", timeout=DESTROY_TIMEOUT_S)
                removed.update(self._remove_libvirt_leftovers())
        finally:
            # Whatever failed above, the daemons this lab started do not outlive it.
            removed["daemons_stopped"] = libvirtd.stop(self.state)
        for name in ("inventory.yml", "known_hosts", "known_hosts.machines.json"):
            (self.state / name).unlink(missing_ok=True)
        for log in (self.state / "console").glob("*.log"):
            log.unlink()
        removed["seconds"] = round(time.monotonic() - started, 1)
        self.echo(f"Vagrant cluster down in {removed['seconds']:.0f}s")
        return removed

    def _remove_libvirt_leftovers(self) -> dict[str, Any]:
        """The pool's volumes (the box image vagrant-libvirt keeps for the next `up`), the pool,
        and the lab's networks that no VM uses any more."""
        out: dict[str, Any] = {"volumes": [], "networks": [], "pool": False}
        pools = libvirtd.virsh("pool-list", "--all", "--name").split()
        if POOL in pools:
            if "running" not in libvirtd.virsh("pool-info", POOL):
                libvirtd.virsh("pool-start", POOL)
            libvirtd.virsh("pool-refresh", POOL)
            listing = libvirtd.virsh("vol-list", "--pool", POOL)  # virsh 9 has no --name here
            for vol in [line.split()[0] for line in listing.splitlines() if line.strip()]:
                libvirtd.virsh("vol-delete", vol, "--pool", POOL)
                out["volumes"].append(vol)
            libvirtd.virsh("pool-destroy", POOL, check=False)
            libvirtd.virsh("pool-undefine", POOL)
            out["pool"] = True
        # The pool's directory is the lab's own: nothing in it outlives the pool.
        leftovers = sorted(p.name for p in (self.state / "pool").glob("*"))
        if leftovers:
            out["volumes"] += [f"{name} (file)" for name in leftovers]
        shutil.rmtree(self.state / "pool", ignore_errors=True)
        networks = libvirtd.virsh("net-list", "--all", "--name").split()
        for name in (private_network_name(self.topology), MANAGEMENT_NETWORK):
            if name not in networks:
                continue
            xml = libvirtd.virsh("net-dumpxml", name)
            if "connections=" in xml.split(">", 1)[0]:
                continue  # still used by some VM (not the lab's: those are destroyed)
            libvirtd.virsh("net-destroy", name, check=False)
            libvirtd.virsh("net-undefine", name)
            out["networks"].append(name)
        return out


def private_network_name(topology: Topology) -> str:
    """The libvirt network of the VMs' private network, as the Vagrantfile names it."""
    return f"gpumon-{topology.bridge}"


def mirror_vars(topology: Topology) -> dict[str, str]:
    from deployer.lab.lab import Lab

    return Lab("default").mirror_vars(topology)
