"""Lab topology: which hosts the lab has, their groups, simulated GPUs and addresses.

A topology is data (``topologies/default.yml`` or any file passed with ``--topology``).  This
module parses and validates it (errors name the file, line and key), scales the GPU host count
and assigns every host its static address on the lab's subnet.

A GPU host names a simulated model (``gpu_model``: a key of the simulator's catalog,
``deployer.lab.gpusim.models.MODELS``), ``gpu_count``, ``nvswitch`` and optionally ``mig``: the
GPU instances of GPUs in MIG mode, either one list of profiles for every GPU or a mapping from
GPU index to a list (the other GPUs keep MIG off). An entry is a profile name (``3g.40gb``) or
``{profile: 3g.71gb, compute_instances: [1c, 2c]}``; only profiles a real capture shows for the
model are accepted (the simulator says which), and the layout must fit the GPU.
"""

from __future__ import annotations

import ipaddress
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.lab.gpusim.models import MODELS as SIMULATED_MODELS
from deployer.lab.gpusim.models import hardware_for
from deployer.yamlsrc import SourceDict, load_yaml_file

DEFAULT_TOPOLOGY = Path(__file__).with_name("topologies") / "default.yml"
KNOWN_GROUPS = (
    "gpu",
    "prometheus",
    "alertmanager",
    "thanos_query",
    "metrics_store",
    "prometheus_global",
)
MONITORING_GROUPS = (
    "prometheus",
    "alertmanager",
    "thanos_query",
    "metrics_store",
    "prometheus_global",
)
GPU_MODELS = tuple(SIMULATED_MODELS)
HOST_VARS = ("cluster", "rack", "slurm_partition", "scrape_tier")
# Host names become veth names (``vb-<name>``, 15 characters at most) and hostnames.
_HOST_NAME = re.compile(r"^[a-z][a-z0-9-]{0,11}$")
_BRIDGE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,15}$")
FIRST_HOST_OCTET = 11
DEFAULT_MIRROR_PORT = 8680


@dataclass(frozen=True)
class LabHost:
    """One host of the lab."""

    name: str
    groups: tuple[str, ...]
    address: str
    gpu_model: str | None = None
    gpu_count: int = 0
    nvswitch: bool = False
    vars: dict[str, Any] = field(default_factory=dict)
    #: MIG layout: None (MIG off), a list of GPU instance profiles for every GPU, or a mapping
    #: GPU index -> list (plain data, as hardware_for() takes it)
    mig: Any = None

    @property
    def is_gpu(self) -> bool:
        return "gpu" in self.groups

    @property
    def mig_gpus(self) -> list[int]:
        """Indices of the GPUs in MIG mode."""
        if self.mig is None:
            return []
        if isinstance(self.mig, list):
            return list(range(self.gpu_count))
        return sorted(int(k) for k in self.mig)


@dataclass(frozen=True)
class Topology:
    """A validated topology with every address assigned."""

    bridge: str
    subnet: ipaddress.IPv4Network
    mirror_port: int
    hosts: tuple[LabHost, ...]
    source: str = "<topology>"
    # the host that runs the lab's slurmctld (``slurm: {controller: HOST}``); None: no Slurm
    slurm_controller: str | None = None

    @property
    def gateway(self) -> str:
        """The bridge's own address: the machine side, where the mirror is served."""
        return str(self.subnet.network_address + 1)

    @property
    def prefixlen(self) -> int:
        return self.subnet.prefixlen

    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts)
        raise InputError(f"no host {name!r} in this lab (hosts: {known})", key=name)

    def group(self, group: str) -> list[LabHost]:
        return [h for h in self.hosts if group in h.groups]


def load_topology(path: Path | None = None, *, gpu_nodes: int | None = None) -> Topology:
    """Parse a topology file (default: the packaged one), scaled to ``gpu_nodes`` GPU hosts."""
    src = Path(path) if path is not None else DEFAULT_TOPOLOGY
    return parse_topology(load_yaml_file(src), source=str(src), gpu_nodes=gpu_nodes)


def parse_topology(data: Any, *, source: str, gpu_nodes: int | None = None) -> Topology:
    """Validate loaded YAML into a Topology; every error names the file, line and key."""
    if not isinstance(data, dict):
        raise InputError("a topology is a mapping with a 'hosts' key", source=source, line=1)
    _only_keys(data, ("network", "mirror", "hosts", "slurm"), source, "")
    network = data.get("network") or {}
    _expect_mapping(network, source, data, "network")
    _only_keys(network, ("bridge", "subnet"), source, "network.")
    bridge = str(network.get("bridge", "gpumonbr0"))
    if not _BRIDGE_NAME.match(bridge):
        raise _err(
            network,
            "bridge",
            "must be an interface name of 1-15 letters, digits, _ or -",
            source,
            "network.bridge",
        )
    try:
        subnet = ipaddress.IPv4Network(str(network.get("subnet", "10.213.0.0/24")), strict=True)
    except ValueError as exc:
        raise _err(
            network, "subnet", f"not an IPv4 network: {exc}", source, "network.subnet"
        ) from exc
    if not subnet.is_private or subnet.num_addresses < 16:
        raise _err(
            network,
            "subnet",
            "must be a private network of at least 16 addresses",
            source,
            "network.subnet",
        )
    mirror = data.get("mirror") or {}
    _expect_mapping(mirror, source, data, "mirror")
    _only_keys(mirror, ("port",), source, "mirror.")
    port = mirror.get("port", DEFAULT_MIRROR_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise _err(mirror, "port", "must be an integer 1024-65535", source, "mirror.port")

    hosts_data = data.get("hosts")
    if not isinstance(hosts_data, dict) or not hosts_data:
        raise _err(
            data, "hosts", "must be a non-empty mapping of host name to settings", source, "hosts"
        )
    specs = [_parse_host(name, spec, hosts_data, source) for name, spec in hosts_data.items()]
    if gpu_nodes is not None:
        specs = _scale_gpu_hosts(specs, gpu_nodes, source)
    hosts = _assign_addresses(specs, subnet, source, hosts_data)
    return Topology(
        bridge=bridge,
        subnet=subnet,
        mirror_port=port,
        hosts=tuple(hosts),
        source=source,
        slurm_controller=_slurm_controller(data, hosts, source),
    )


def _slurm_controller(data: dict, hosts: list[LabHost], source: str) -> str | None:
    """``slurm: {controller: HOST}``: the lab host that runs slurmctld (``lab slurm``)."""
    if "slurm" not in data:
        return None
    slurm = data.get("slurm") or {}
    _expect_mapping(slurm, source, data, "slurm")
    _only_keys(slurm, ("controller",), source, "slurm.")
    controller = slurm.get("controller")
    names = [h.name for h in hosts]
    if controller not in names:
        raise _err(
            slurm or data,
            "controller" if slurm else "slurm",
            f"must name a host of the topology ({', '.join(names)})",
            source,
            "slurm.controller",
        )
    return str(controller)


def _parse_host(name: Any, spec: Any, parent: dict, source: str) -> dict[str, Any]:
    key = f"hosts.{name}"
    if not isinstance(name, str) or not _HOST_NAME.match(name):
        raise _err(
            parent,
            name,
            "host names are 1-12 characters: a lowercase letter, then "
            "lowercase letters, digits or '-'",
            source,
            key,
        )
    if spec is None:
        spec = {}
    _expect_mapping(spec, source, parent, name, dotted=key)
    allowed = ("groups", "address", "gpu_model", "gpu_count", "nvswitch", "mig", *HOST_VARS)
    _only_keys(spec, allowed, source, key + ".")
    groups = spec.get("groups")
    if not isinstance(groups, list) or not groups:
        raise _err(
            spec or parent,
            "groups" if spec else name,
            f"must list the host's groups, some of: {', '.join(KNOWN_GROUPS)}",
            source,
            key + ".groups",
        )
    for group in groups:
        if group not in KNOWN_GROUPS:
            raise _err(
                spec,
                "groups",
                f"unknown group {group!r} (known: {', '.join(KNOWN_GROUPS)})",
                source,
                key + ".groups",
            )
    out: dict[str, Any] = {"name": name, "groups": tuple(groups), "line": _line(parent, name)}
    if "address" in spec:
        out["address"] = (spec["address"], _line(spec, "address"))
    is_gpu = "gpu" in groups
    gpu_keys = [k for k in ("gpu_model", "gpu_count", "nvswitch", "mig") if k in spec]
    if not is_gpu and gpu_keys:
        raise _err(
            spec,
            gpu_keys[0],
            "only hosts in group 'gpu' describe GPUs",
            source,
            f"{key}.{gpu_keys[0]}",
        )
    if is_gpu:
        model = spec.get("gpu_model")
        if model not in GPU_MODELS:
            raise _err(
                spec,
                "gpu_model" if "gpu_model" in spec else "groups",
                f"gpu_model must be one of {', '.join(GPU_MODELS)}",
                source,
                key + ".gpu_model",
            )
        count = spec.get("gpu_count")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 16:
            raise _err(
                spec,
                "gpu_count" if "gpu_count" in spec else "groups",
                "gpu_count must be an integer 1-16",
                source,
                key + ".gpu_count",
            )
        nvswitch = spec.get("nvswitch", False)
        if not isinstance(nvswitch, bool):
            raise _err(spec, "nvswitch", "must be true or false", source, key + ".nvswitch")
        out.update(gpu_model=model, gpu_count=count, nvswitch=nvswitch)
        if "mig" in spec:
            out["mig"] = _parse_mig(spec, name, model, count, nvswitch, source, key)
    out["vars"] = {k: spec[k] for k in HOST_VARS if k in spec}
    for k, v in out["vars"].items():
        if not isinstance(v, str | int):
            raise _err(spec, k, "must be a string", source, f"{key}.{k}")
    return out


def _plain(value: Any) -> Any:
    """YAML-loaded data as plain lists, dicts and strings (JSON-safe, comparable)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _parse_mig(spec: dict, name: str, model: str, count: int, nvswitch: bool, source: str,
               key: str) -> Any:  # fmt: skip
    raw = spec["mig"]
    if isinstance(raw, dict):
        layout: Any = {}
        for gpu, entries in raw.items():
            if isinstance(gpu, bool) or not isinstance(gpu, int):
                raise _err(raw, gpu, "GPU indices are integers", source, f"{key}.mig.{gpu}")
            if not isinstance(entries, list) or not entries:
                raise _err(raw, gpu, "a non-empty list of GPU instance profiles", source,
                           f"{key}.mig.{gpu}")  # fmt: skip
            layout[gpu] = _plain(entries)
    elif isinstance(raw, list) and raw:
        layout = _plain(raw)
    else:
        raise _err(spec, "mig", "a list of GPU instance profiles (e.g. [3g.40gb, 2g.20gb]) or a "
                   "mapping GPU index -> list", source, f"{key}.mig")  # fmt: skip
    try:  # the simulator knows which profiles and layouts are real for the model
        hardware_for(model, count, name, nvswitch, layout)
    except InputError as exc:
        raise _err(spec, "mig", exc.message, source, f"{key}.mig") from None
    return layout


def _scale_gpu_hosts(specs: list[dict[str, Any]], count: int, source: str) -> list[dict]:
    gpu = [s for s in specs if "gpu" in s["groups"]]
    if count < 0:
        raise InputError("--gpu-nodes must be 0 or more", source="--gpu-nodes")
    if not gpu and count:
        raise InputError("the topology has no GPU host to scale", source=source)
    if count <= len(gpu):
        dropped = {s["name"] for s in gpu[count:]}
        return [s for s in specs if s["name"] not in dropped]
    taken = {s["name"] for s in specs}
    extra: list[dict[str, Any]] = []
    index = 1
    while len(gpu) + len(extra) < count:
        name = f"gpu{index:02d}"
        index += 1
        if name in taken:
            continue
        model = gpu[(len(gpu) + len(extra)) % len(gpu)]
        clone = {k: v for k, v in model.items() if k not in ("address", "name")}
        clone["name"] = name
        extra.append(clone)
        taken.add(name)
    return specs + extra


def _assign_addresses(
    specs: list[dict[str, Any]], subnet: ipaddress.IPv4Network, source: str, parent: dict
) -> list[LabHost]:
    reserved = {subnet.network_address + 1}
    explicit: dict[str, ipaddress.IPv4Address] = {}
    for spec in specs:
        if "address" not in spec:
            continue
        raw, line = spec["address"]
        try:
            addr = ipaddress.IPv4Address(str(raw))
        except ValueError as exc:
            raise InputError(
                f"not an IPv4 address: {exc}",
                source=source,
                line=line,
                key=f"hosts.{spec['name']}.address",
            ) from exc
        if (
            addr not in subnet
            or addr in reserved
            or addr in (subnet.network_address, subnet.broadcast_address)
        ):
            raise InputError(
                f"{addr} is not a free host address of {subnet} (.1 is the bridge)",
                source=source,
                line=line,
                key=f"hosts.{spec['name']}.address",
            )
        if addr in explicit.values():
            raise InputError(
                f"{addr} is given to two hosts",
                source=source,
                line=line,
                key=f"hosts.{spec['name']}.address",
            )
        explicit[spec["name"]] = addr
    used = reserved | set(explicit.values())
    candidates = (
        subnet.network_address + i for i in range(FIRST_HOST_OCTET, subnet.num_addresses - 1)
    )
    hosts = []
    for spec in specs:
        addr = explicit.get(spec["name"])
        if addr is None:
            addr = next((a for a in candidates if a not in used), None)
            if addr is None:
                raise InputError(
                    f"{subnet} has no free address left for {spec['name']}",
                    source=source,
                    key="network.subnet",
                )
            used.add(addr)
        hosts.append(
            LabHost(
                name=spec["name"],
                groups=spec["groups"],
                address=str(addr),
                gpu_model=spec.get("gpu_model"),
                gpu_count=spec.get("gpu_count", 0),
                nvswitch=spec.get("nvswitch", False),
                vars=dict(spec["vars"]),
                mig=spec.get("mig"),
            )
        )
    return hosts


def for_lab_name(topology: Topology, name: str) -> Topology:
    """A lab other than ``default`` gets its own bridge and /24, derived from its name.

    Only used when the topology keeps the packaged network settings, so two named labs do not
    fight over one bridge.  (Host names must still differ between labs running at once: each
    host's veth is named after it.)
    """
    if name == "default":
        return topology
    tag = zlib.crc32(name.encode()) & 0xFFFFFFFF
    bridge = f"gpumon-{tag:08x}"
    third = 1 + tag % 250
    subnet = ipaddress.IPv4Network(f"10.213.{third}.0/24")
    offset = int(subnet.network_address) - int(topology.subnet.network_address)
    if topology.subnet.prefixlen != 24:
        return topology
    hosts = tuple(
        LabHost(
            h.name,
            h.groups,
            str(ipaddress.IPv4Address(int(ipaddress.IPv4Address(h.address)) + offset)),
            h.gpu_model,
            h.gpu_count,
            h.nvswitch,
            dict(h.vars),
            h.mig,
        )
        for h in topology.hosts
    )
    return Topology(
        bridge=bridge,
        subnet=subnet,
        mirror_port=topology.mirror_port,
        hosts=hosts,
        source=topology.source,
        slurm_controller=topology.slurm_controller,
    )


def _line(mapping: Any, key: Any) -> int | None:
    return mapping.line_of(key) if isinstance(mapping, SourceDict) else None


def _err(mapping: Any, key: Any, message: str, source: str, dotted: str) -> InputError:
    return InputError(message, source=source, line=_line(mapping, key), key=dotted)


def _expect_mapping(
    value: Any, source: str, parent: Any, key: Any, *, dotted: str | None = None
) -> None:
    if not isinstance(value, dict):
        raise _err(parent, key, "must be a mapping", source, dotted or str(key))


def _only_keys(mapping: dict, allowed: tuple[str, ...], source: str, prefix: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise _err(
                mapping,
                key,
                f"unknown key (allowed: {', '.join(allowed)})",
                source,
                f"{prefix}{key}",
            )
