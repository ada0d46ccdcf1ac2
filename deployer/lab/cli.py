"""``gpumon-deploy lab ...``: the click command group over ``deployer.lab.Lab``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from deployer.errors import HostUnreachable, InputError
from deployer.lab.lab import Lab, LabError, default_topology
from deployer.lab.topology import load_topology

_name_option = click.option(
    "--name",
    default="default",
    show_default=True,
    help="Lab name (state in /var/lib/gpumon-lab/NAME).",
)


def _lab(name: str) -> Lab:
    return Lab(name, echo=lambda msg: click.echo(msg, err=True))


def _fail(exc: Exception) -> None:
    code = 2 if isinstance(exc, InputError) else 1
    click.echo(f"error: {exc}", err=True)
    sys.exit(code)


@click.group("lab")
def lab() -> None:
    """A local multi-host test cluster (systemd-nspawn hosts; GPUs are SIMULATED)."""


@lab.command()
@click.option(
    "--gpu-nodes",
    type=click.IntRange(min=0),
    default=None,
    help="Number of GPU hosts (default: as the topology says).",
)
@click.option(
    "--topology",
    "topology_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Topology YAML (default: the packaged default topology).",
)
@_name_option
def up(gpu_nodes: int | None, topology_file: Path | None, name: str) -> None:
    """Bring the lab up (idempotent) and wait until every host answers SSH."""
    try:
        if topology_file is None:
            topology = default_topology(name, gpu_nodes)
        else:
            # A topology file names its own bridge and subnet; it is used as written.
            topology = load_topology(topology_file, gpu_nodes=gpu_nodes)
        timings = _lab(name).up(topology)
    except (InputError, LabError, HostUnreachable, OSError, RuntimeError) as exc:
        _fail(exc)
        return
    click.echo(json.dumps({k: round(v, 1) for k, v in timings.items()}))


@lab.command()
@_name_option
def down(name: str) -> None:
    """Stop every host, unmount, stop the mirror and delete the bridge."""
    try:
        _lab(name).down()
    except (LabError, OSError, RuntimeError) as exc:
        _fail(exc)


@lab.command()
@_name_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(name: str, as_json: bool) -> None:
    """Show hosts, addresses, faults, the mirror and the lab's Slurm (when `lab slurm` ran)."""
    from deployer.lab import slurm

    the_lab = _lab(name)
    info = the_lab.status()
    # Slurm runs on the lab, so it reads the lab, never the other way round
    if info["up"] and (slurm_status := slurm.status(the_lab)) is not None:
        info["slurm"] = slurm_status
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    if not info["up"]:
        click.echo(f"lab {name!r} is down")
        return
    click.echo(
        f"lab {name!r}: bridge {info['bridge']['name']} {info['bridge']['address']}"
        f" ({'present' if info['bridge']['exists'] else 'MISSING'}); mirror "
        f"{info['mirror']['url']} ({'serving' if info['mirror']['serving'] else 'DOWN'};"
        f" GPU simulation {info['mirror']['gpu_simulation']})"
    )
    store = info["s3"]
    click.echo(
        f"s3 {store['url']} bucket {store['bucket']} ({'serving' if store['serving'] else 'DOWN'})"
    )
    for host, h in info["hosts"].items():
        faults = ",".join(f["kind"] for f in h["faults"]) or "-"
        link = {True: "up", False: "CUT", None: "none"}[h["link_up"]]
        click.echo(
            f"  {host:<8} {h['address']:<14} {'running' if h['running'] else 'STOPPED':<8}"
            f" link={link:<4} boots={h['boots']} faults={faults}"
            f" {h.get('gpus', '')}"
        )
    slurm = info.get("slurm")
    if slurm:
        if slurm.get("error"):
            click.echo(f"slurm: controller {slurm['controller']} does not answer: {slurm['error']}")
        else:
            nodes = ", ".join(
                f"{n} {s['state']}" + (f" ({s['reason']})" if s["reason"] else "")
                for n, s in slurm["nodes"].items()
            )
            click.echo(f"slurm: controller {slurm['controller']}; {nodes}")
    click.echo(f"inventory: {info['inventory']}")


@lab.command("slurm")
@_name_option
def slurm_cmd(name: str) -> None:
    """Run the lab's Slurm (idempotent): slurmctld on the topology's slurm controller, slurmd
    on every GPU host with its simulated GPUs as GRES. Lab only, never a product role."""
    from deployer.lab import slurm

    try:
        timings = slurm.bring_up(_lab(name), echo=lambda msg: click.echo(msg, err=True))
    except (InputError, LabError, HostUnreachable, OSError, RuntimeError) as exc:
        _fail(exc)
        return
    click.echo(json.dumps({k: round(v, 1) for k, v in timings.items()}))


def _parse_value(raw: str | None) -> Any:
    if raw is None:
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


@lab.command()
@click.argument("host")
@click.argument("kind")
@click.option("--gpu", type=int, default=None, help="GPU index the fault applies to.")
@click.option("--value", default=None, help="Fault value (temperature, XID code, ...).")
@_name_option
def fault(host: str, kind: str, gpu: int | None, value: str | None, name: str) -> None:
    """Inject a fault into HOST. KIND: host-down, partition, exporter-down, or a GPU fault
    (gpu-temp, memory-temp, xid, ecc-dbe, gpu-missing, upgrade-validation)."""
    try:
        _lab(name).fault(host, kind, gpu=gpu, value=_parse_value(value))
    except (InputError, LabError, OSError, RuntimeError) as exc:
        _fail(exc)


@lab.command()
@click.argument("host")
@_name_option
def heal(host: str, name: str) -> None:
    """Undo every fault on HOST and wait until it is ready again."""
    try:
        _lab(name).heal(host)
    except (InputError, LabError, HostUnreachable, OSError, RuntimeError) as exc:
        _fail(exc)


@lab.command()
@_name_option
def inventory(name: str) -> None:
    """Print the path of the inventory the lab wrote."""
    the_lab = Lab(name)
    if not the_lab.inventory_path.is_file():
        _fail(LabError(f"lab {name!r} has no inventory (run `gpumon-deploy lab up`)"))
    click.echo(str(the_lab.inventory_path))


def _topology_for(name: str, topology_file: Path | None, gpu_nodes: int | None):
    if topology_file is None:
        return default_topology(name, gpu_nodes)
    return load_topology(topology_file, gpu_nodes=gpu_nodes)


_topology_option = click.option(
    "--topology",
    "topology_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Topology YAML (default: the packaged default topology).",
)
_gpu_nodes_option = click.option("--gpu-nodes", type=click.IntRange(min=0), default=None)


@lab.command("mirror")
@click.option("--address", default=None, help="Address to serve on (default: the bridge's .1).")
@click.option("--port", type=click.IntRange(1024, 65535), default=None)
@click.option("--stop", is_flag=True, help="Stop the mirror this command started.")
@_topology_option
@_name_option
def mirror_cmd(
    address: str | None, port: int | None, stop: bool, topology_file: Path | None, name: str
) -> None:
    """Build the offline mirror and serve it (detached) without lab hosts, e.g. for Vagrant VMs
    on their private network; --stop ends it."""
    from deployer.lab import mirror as mirror_mod

    the_lab = Lab(name)
    pid_file = the_lab.dir / "standalone-mirror.pid"
    if stop:
        mirror_mod.stop_serving(pid_file)
        return
    try:
        topo = _topology_for(name, topology_file, None)
        the_lab.dir.mkdir(parents=True, exist_ok=True)
        mirror_mod.ensure_mirror(the_lab.dir / "mirror-build.log")
        addr, prt = address or topo.gateway, port or topo.mirror_port
        mirror_mod.serve(addr, prt, pid_file, the_lab.dir / "standalone-mirror.log")
    except (InputError, OSError, RuntimeError) as exc:
        _fail(exc)
        return
    click.echo(f"http://{addr}:{prt}")


# ---------------------------------------------------------------- Vagrant clusters

_vagrant_topology_option = click.option(
    "--topology",
    "topology_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    envvar="GPUMON_LAB_TOPOLOGY",
    show_envvar=True,
    help="Topology YAML (default: the packaged default topology); the Vagrantfile reads the same "
    "variable.",
)
_vagrant_dir_option = click.option(
    "--vagrant-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of the Vagrantfile (default: the repository's).",
)


def _vagrant_cluster(
    topology_file: Path | None, vagrant_dir: Path | None, driver: str = "kvm", box: str = "auto"
):
    from deployer.lab.topology import DEFAULT_TOPOLOGY
    from deployer.lab.vagrant_cluster import VagrantCluster, default_vagrant_dir

    return VagrantCluster(
        topology_file=topology_file or DEFAULT_TOPOLOGY,
        vagrant_dir=vagrant_dir or default_vagrant_dir(),
        driver=driver,
        box=box,
        echo=lambda msg: click.echo(msg, err=True),
    )


def _vagrant_errors() -> tuple[type[Exception], ...]:
    from deployer.lab.libvirtd import LibvirtError
    from deployer.lab.mirror import MirrorError
    from deployer.lab.vagrant_box import BoxBuildError
    from deployer.lab.vagrant_cluster import VagrantError

    return (InputError, OSError, BoxBuildError, LibvirtError, MirrorError, VagrantError)


@lab.command("vagrant-box")
def vagrant_box_cmd() -> None:
    """Build the lab's own libvirt box (Debian 12 from the lab's base; cached, rebuilt only when
    its inputs change) and add it to Vagrant as gpumon-lab/bookworm64."""
    from deployer.lab import vagrant_box
    from deployer.lab.vagrant_cluster import vagrant_state

    try:
        state = vagrant_state()
        state.mkdir(parents=True, exist_ok=True)
        box = vagrant_box.ensure_box(state / "box-build.log")
        env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1"}
        added = vagrant_box.install(box, env, state / "vagrant.log")
    except _vagrant_errors() as exc:
        _fail(exc)
        return
    click.echo(
        json.dumps(
            {
                "box": vagrant_box.BOX_NAME,
                "version": box.version,
                "file": str(box.path),
                "built": box.built,
                "added": added,
                "seconds": round(box.seconds, 1),
            }
        )
    )


@lab.command("vagrant-up")
@_vagrant_topology_option
@_vagrant_dir_option
@click.option(
    "--driver",
    type=click.Choice(["kvm", "qemu"]),
    default="kvm",
    show_default=True,
    envvar="GPUMON_LIBVIRT_DRIVER",
    show_envvar=True,
    help="qemu: software emulation, where KVM cannot boot a guest (slow).",
)
@click.option(
    "--box",
    default="auto",
    show_default=True,
    envvar="GPUMON_VAGRANT_BOX",
    show_envvar=True,
    help="auto (the public debian/bookworm64 if Vagrant has it, else the lab's own box), lab, "
    "public, or a box name.",
)
def vagrant_up_cmd(
    topology_file: Path | None, vagrant_dir: Path | None, driver: str, box: str
) -> None:
    """Bring the topology up as libvirt VMs (box, mirror, `vagrant up`, provisioning) and write
    the inventory; print timings and its path."""
    try:
        result = _vagrant_cluster(topology_file, vagrant_dir, driver, box).up()
    except _vagrant_errors() as exc:
        _fail(exc)
        return
    click.echo(json.dumps(result))


@lab.command("vagrant-down")
@_vagrant_topology_option
@_vagrant_dir_option
def vagrant_down_cmd(topology_file: Path | None, vagrant_dir: Path | None) -> None:
    """`vagrant destroy`, then remove what libvirt keeps (box volume, the lab's pool and
    networks) and stop the libvirt daemons vagrant-up started."""
    try:
        result = _vagrant_cluster(topology_file, vagrant_dir).down()
    except _vagrant_errors() as exc:
        _fail(exc)
        return
    click.echo(json.dumps(result))


@lab.command("vagrant-prepare")
@_vagrant_topology_option
@_gpu_nodes_option
def vagrant_prepare(topology_file: Path | None, gpu_nodes: int | None) -> None:
    """Build the mirror and write the files the Vagrantfile uploads: each GPU VM's simulated
    hardware, the files every lab host gets; make the console log directory."""
    from deployer.lab import mirror as mirror_mod
    from deployer.lab.vagrant import prepare_hardware, prepare_host_files
    from deployer.lab.vagrant_cluster import vagrant_state

    try:
        topo = _topology_for("default", topology_file, gpu_nodes)
        mirror_mod.ensure_mirror()
        state = vagrant_state()
        written = prepare_hardware(topo, state / "hardware")
        written.append(prepare_host_files(state / "host-files"))
        (state / "console").mkdir(parents=True, exist_ok=True)
    except _vagrant_errors() as exc:
        _fail(exc)
        return
    for path in written:
        click.echo(str(path))


@lab.command("vagrant-inventory")
@_vagrant_dir_option
@click.option(
    "--ssh-config",
    "ssh_config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Read this `vagrant ssh-config` output instead of running vagrant.",
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None)
@_vagrant_topology_option
@_gpu_nodes_option
def vagrant_inventory_cmd(
    vagrant_dir: Path | None,
    ssh_config_file: Path | None,
    output: Path | None,
    topology_file: Path | None,
    gpu_nodes: int | None,
) -> None:
    """Write the inventory of the Vagrant VMs from `vagrant ssh-config` (host keys checked
    against the VMs' consoles where the lab's box printed them); print its path."""
    from deployer.lab.vagrant import run_ssh_config, write_vagrant_inventory
    from deployer.lab.vagrant_cluster import default_vagrant_dir, mirror_vars, vagrant_state

    try:
        topo = _topology_for("default", topology_file, gpu_nodes)
        directory = vagrant_dir or default_vagrant_dir()
        if ssh_config_file is not None:
            text, source = ssh_config_file.read_text(), str(ssh_config_file)
        else:
            text, source = run_ssh_config(directory), "vagrant ssh-config"
        out = output or vagrant_state() / "inventory.yml"
        path = write_vagrant_inventory(
            topo,
            text,
            out,
            mirror_vars(topo),
            source,
            console_dir=vagrant_state() / "console",
            vagrant_dir=directory,
        )
    except _vagrant_errors() as exc:
        _fail(exc)
        return
    click.echo(str(path))


def _register_light() -> None:
    from deployer.lab.light import light_command

    lab.add_command(light_command())


_register_light()
