"""The lab's Slurm: Debian 12's Slurm 22.05 on the lab's hosts, for the drain hooks and the
job-aware features to meet a real ``slurmctld``. Lab only: the product never installs Slurm.

``gpumon-deploy lab slurm`` (``bring_up``) installs from the lab's offline mirror, with
``--no-install-recommends``: ``slurmctld`` + ``slurm-client`` + ``munge`` on the topology's
``slurm.controller`` host, ``slurmd`` + ``slurm-client`` + ``munge`` on every GPU host, one munge
key for all (``<lab dir>/munge.key``, 0600; 0400 munge:munge on the hosts), and the same
``slurm.conf`` everywhere: one node per GPU host with ``Gres=gpu:<model>:<count>`` from its
simulated GPUs, one partition per ``slurm_partition`` host var. ``gres.conf`` names the
SIMULATED device nodes (``deployer.lab.devnodes``): with ``Count`` only, slurmd reports 0 GPUs
and the node goes INVAL. The Prolog and Epilog are directories of scripts, as many sites keep
them (``Prolog=/etc/slurm/prolog.d/*``, ``Epilog=/etc/slurm/epilog.d/*``), each holding one script
of the lab "site" (it logs the job and its GPUs to ``/var/log/slurm/lab-site-hooks.log``); the
product's ``dcgm_exporter`` role adds its job-map hook beside them when told the directories
(``dcgm_exporter_slurm_prolog_dir``/``_epilog_dir``), as it would at a site. It is idempotent: files are replaced and daemons restarted only when
their content changed, and it ends when every node answers (bounded wait).

It is a subcommand rather than part of ``lab up`` because only the Slurm tests need it, and
``lab up`` time is paid by every test session; it survives host reboots (the packages and files
live in each host's upper layer) and ``lab down`` forgets it with the hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.errors import InputError
from deployer.lab import devnodes
from deployer.lab.topology import LabHost, Topology

if TYPE_CHECKING:
    from deployer.lab.lab import Lab

CLUSTER_NAME = "gpumonlab"
DEFAULT_PARTITION = "gpu"
CONTROLLER_PACKAGES = ("munge", "slurm-client", "slurmctld")
NODE_PACKAGES = ("munge", "slurm-client", "slurmd")
MUNGE_KEY_BYTES = 1024  # mungekey's default size (munge 0.5.15: 1024 bytes)
READY_TIMEOUT_S = 120.0
INSTALL_TIMEOUT_S = 600.0
STATE_FILE = "slurm.json"
PROLOG_DIR = "/etc/slurm/prolog.d"
EPILOG_DIR = "/etc/slurm/epilog.d"
SITE_HOOK = "10-lab-site"
SITE_HOOK_LOG = "/var/log/slurm/lab-site-hooks.log"
# sinfo's long state names that mean "slurmd answers and the node has a valid configuration"
# (a trailing '*' means not responding; inval/unk/down are the failures to report).
_ANSWERING = re.compile(r"^(idle|mixed|allocated|completing|drained|draining|reserved|planned)$")


@dataclass(frozen=True)
class SlurmCluster:
    """The lab's Slurm cluster: its controller and its compute nodes (the GPU hosts)."""

    controller: LabHost
    nodes: tuple[LabHost, ...]

    @property
    def hosts(self) -> tuple[LabHost, ...]:
        return (self.controller, *(n for n in self.nodes if n.name != self.controller.name))

    def partitions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            out.setdefault(str(n.vars.get("slurm_partition") or DEFAULT_PARTITION), []).append(
                n.name
            )
        return out


def cluster_for(topology: Topology) -> SlurmCluster:
    if not topology.slurm_controller:
        raise InputError(
            "the topology names no Slurm controller (add `slurm: {controller: HOST}`)",
            source=topology.source,
            key="slurm.controller",
        )
    nodes = tuple(topology.group("gpu"))
    if not nodes:
        raise InputError("the topology has no GPU host to run slurmd", source=topology.source)
    return SlurmCluster(controller=topology.host(topology.slurm_controller), nodes=nodes)


def gres_type(model: str | None) -> str:
    """The GRES type of a simulated model: Slurm type names are case-sensitive and sites write
    them in lower case (``gpu:h100:8``)."""
    return (model or "gpu").lower()


def _node_line(n: LabHost) -> str:
    # CPUs: one per GPU, so that jobs of one GPU each can share a node; the container sees the
    # machine's cores, so slurmd's own count differs (SlurmdParameters=config_overrides).
    return (
        f"NodeName={n.name} NodeAddr={n.address} CPUs={max(1, n.gpu_count)} "
        f"Gres=gpu:{gres_type(n.gpu_model)}:{n.gpu_count} State=UNKNOWN"
    )


def slurm_conf(cluster: SlurmCluster) -> str:
    """``/etc/slurm/slurm.conf``, the same on every host."""
    c = cluster.controller
    lines = [
        "# Written by `gpumon-deploy lab slurm` (the lab's Slurm; GPUs are SIMULATED).",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={c.name}({c.address})",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        # the hosts are containers: no cgroup hierarchy of Slurm's own to track or confine in
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        # a node that stopped answering (a reboot) comes back by itself once slurmd registers;
        # a drained node stays drained (the DRAIN flag and its reason are kept)
        "ReturnToService=1",
        "SlurmdTimeout=60",
        "MinJobAge=60",
        "MpiDefault=none",
        # the site's Prolog/Epilog: every script of a directory, in name order (a glob; Slurm
        # 22.05 stops at the first that fails, and a failing Prolog drains the node)
        f"Prolog={PROLOG_DIR}/*",
        f"Epilog={EPILOG_DIR}/*",
        "",
        *(_node_line(n) for n in cluster.nodes),
        "",
    ]
    for i, (name, nodes) in enumerate(cluster.partitions().items()):
        default = "YES" if i == 0 else "NO"
        lines.append(
            f"PartitionName={name} Nodes={','.join(nodes)} Default={default} "
            "MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def gres_conf(cluster: SlurmCluster) -> str:
    """``/etc/slurm/gres.conf``: every node's GPUs by device file (see the module docstring)."""
    lines = ["# Written by `gpumon-deploy lab slurm`: SIMULATED GPUs (deployer.lab.devnodes)"]
    for n in cluster.nodes:
        if n.gpu_count < 1:
            continue
        files = devnodes.gpu_device(0) if n.gpu_count == 1 else f"/dev/nvidia[0-{n.gpu_count - 1}]"
        lines.append(f"NodeName={n.name} Name=gpu Type={gres_type(n.gpu_model)} File={files}")
    return "\n".join(lines) + "\n"


def site_hook(mode: str) -> str:
    """The lab site's own Prolog or Epilog script: a site that globs a directory has scripts of
    its own there, and a glob that matches nothing fails the Prolog (SchedMD/slurm
    src/plugins/prep/script/prep_script_slurmd.c @ tag slurm-22-05-8-1, d525b687: on
    GLOB_NOMATCH _script_list_create returns no list, :85-108, and slurmd_script returns
    error("... Unable to create list of paths ..."), :202-204; slurmd reports
    ESLURMD_PROLOG_FAILED, src/slurmd/slurmd/req.c:1550-1560, and slurmctld drains the node
    with reason "Prolog error", src/slurmctld/node_mgr.c:2986-2998)."""
    return (
        "#!/bin/sh\n"
        f"# Written by `gpumon-deploy lab slurm`: the lab site's own Slurm {mode.capitalize()}.\n"
        f'echo "$(date +%s) {mode} job=${{SLURM_JOB_ID:-}} gpus=${{SLURM_JOB_GPUS:-}}" '
        f">> {SITE_HOOK_LOG}\n"
        "exit 0\n"
    )


def munge_key(lab_dir: Path) -> bytes:
    """The lab's one munge key (made on first use, 0600 in the lab's state directory)."""
    path = lab_dir / "munge.key"
    if not path.is_file():
        tmp = path.with_name(".munge.key.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(MUNGE_KEY_BYTES))
        os.replace(tmp, path)
    os.chmod(path, 0o600)
    return path.read_bytes()


def _put_file(path: str, content: bytes, mode: str, owner: str, flag: str) -> str:
    """Shell: replace ``path`` when its content differs (then ``touch $flag``); base64 so that
    binary content (the munge key) passes through the script on stdin, never an argument."""
    import base64

    data = base64.b64encode(content).decode()
    p = shlex.quote(path)
    return (
        f"mkdir -p $(dirname {p})\n"
        f"printf '%s' {shlex.quote(data)} | base64 -d > {p}.new\n"
        f"chmod {mode} {p}.new\n"
        f"if ! cmp -s {p}.new {p}; then mv -f {p}.new {p}; touch {flag}; "
        f"else rm -f {p}.new; fi\n"
        f"chown {owner} {p} 2>/dev/null || true\n"
    )


def host_script(cluster: SlurmCluster, host: LabHost, key: bytes) -> str:
    """The whole set-up of one host, as one shell script fed on stdin (idempotent)."""
    controller = host.name == cluster.controller.name
    packages = set(NODE_PACKAGES if host.is_gpu else ())
    if controller:
        packages |= set(CONTROLLER_PACKAGES)
    daemons = (["slurmctld"] if controller else []) + (["slurmd"] if host.is_gpu else [])
    pkgs = " ".join(sorted(packages))
    flag_munge, flag_slurm = "/run/gpumon-lab-slurm.munge", "/run/gpumon-lab-slurm.conf"
    script = [
        "set -eu",
        f"rm -f {flag_munge} {flag_slurm}",
        # munge's postinst keeps an existing key (and chowns it); write ours first
        _put_file("/etc/munge/munge.key", key, "0400", "munge:munge", flag_munge),
        _put_file(
            "/etc/slurm/slurm.conf", slurm_conf(cluster).encode(), "0644", "root:root", flag_slurm
        ),
        _put_file(
            "/etc/slurm/gres.conf", gres_conf(cluster).encode(), "0644", "root:root", flag_slurm
        ),
        # read at each job: a change needs no restart
        _put_file(
            f"{PROLOG_DIR}/{SITE_HOOK}",
            site_hook("prolog").encode(),
            "0755",
            "root:root",
            "/run/gpumon-lab-slurm.hooks",
        ),
        _put_file(
            f"{EPILOG_DIR}/{SITE_HOOK}",
            site_hook("epilog").encode(),
            "0755",
            "root:root",
            "/run/gpumon-lab-slurm.hooks",
        ),
        f"missing=$(for p in {pkgs}; do dpkg-query -W -f='${{Status}}' \"$p\" 2>/dev/null "
        "| grep -q 'install ok installed' || echo \"$p\"; done)",
        'if [ -n "$missing" ]; then',
        # no daemon starts from a postinst (an invoke-rc.d failure would fail the install);
        # they are started below, once configured
        "  printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d; chmod 0755 /usr/sbin/policy-rc.d",
        "  trap 'rm -f /usr/sbin/policy-rc.d' EXIT",
        "  export DEBIAN_FRONTEND=noninteractive",
        "  apt-get update -q >/tmp/gpumon-lab-slurm-apt.log 2>&1 || "
        "{ tail -5 /tmp/gpumon-lab-slurm-apt.log >&2; exit 1; }",
        "  apt-get install -y -q --no-install-recommends $missing "
        ">>/tmp/gpumon-lab-slurm-apt.log 2>&1 || "
        "{ tail -5 /tmp/gpumon-lab-slurm-apt.log >&2; exit 1; }",
        "  rm -f /usr/sbin/policy-rc.d",
        f"  touch {flag_munge} {flag_slurm}",
        "fi",
        "chown munge:munge /etc/munge/munge.key",
        "systemctl is-enabled -q munge || systemctl enable -q munge",
        f"if [ -e {flag_munge} ] || ! systemctl is-active -q munge; then systemctl restart munge; fi",
    ]
    for d in daemons:
        script += [
            f"systemctl is-enabled -q {d} || systemctl enable -q {d}",
            f"if [ -e {flag_munge} ] || [ -e {flag_slurm} ] || ! systemctl is-active -q {d}; "
            f"then systemctl restart {d}; fi",
        ]
    script += [f"rm -f {flag_munge} {flag_slurm} /run/gpumon-lab-slurm.hooks", ""]
    return "\n".join(script)


def config_digest(cluster: SlurmCluster) -> str:
    return hashlib.sha256((slurm_conf(cluster) + gres_conf(cluster)).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- bring-up and status


def bring_up(lab: Lab, *, echo: Callable[[str], None] | None = None) -> dict[str, float]:
    """Install and configure Slurm on the lab (idempotent); wait until every node answers.
    Returns timings in seconds."""
    from deployer.lab.lab import LabError

    say = echo or (lambda _m: None)
    started = time.monotonic()
    topology = lab.require_topology()
    cluster = cluster_for(topology)
    key = munge_key(lab.dir)

    def one(host: LabHost) -> str | None:
        proc = lab.ssh(
            host.name, "sh -s", input=host_script(cluster, host, key), timeout=INSTALL_TIMEOUT_S
        )
        if proc.returncode != 0:
            return f"{host.name}: {(proc.stderr or proc.stdout).strip()[-400:]}"
        return None

    say(
        f"Slurm: slurmctld on {cluster.controller.name}, slurmd on "
        f"{', '.join(n.name for n in cluster.nodes)}"
    )
    # the controller first: slurmd registers with it as soon as it starts
    problem = one(cluster.controller)
    if problem:
        raise LabError(f"setting up Slurm failed: {problem}")
    others = [h for h in cluster.hosts if h.name != cluster.controller.name]
    with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
        problems = [p for p in pool.map(one, others) if p]
    if problems:
        raise LabError("setting up Slurm failed: " + "; ".join(problems))
    installed = time.monotonic() - started
    wait_nodes_answer(lab, cluster)
    (lab.dir / STATE_FILE).write_text(
        json.dumps({"controller": cluster.controller.name, "config": config_digest(cluster)})
    )
    ready = time.monotonic() - started
    say(f"Slurm up: {len(cluster.nodes)} nodes answer {cluster.controller.name} in {ready:.1f}s")
    return {"installed": installed, "ready": ready}


def parse_sinfo_nodes(text: str) -> dict[str, dict[str, str]]:
    """``sinfo -h -N -o '%N|%T|%E'`` -> ``{node: {"state", "reason"}}`` (one line per node and
    partition; the first wins; a reason may hold '|')."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) < 2 or not parts[0].strip():
            continue
        reason = parts[2].strip() if len(parts) > 2 else ""
        out.setdefault(
            parts[0].strip(),
            {"state": parts[1].strip(), "reason": "" if reason == "none" else reason},
        )
    return out


SINFO_NODES = "sinfo -h -N -o '%N|%T|%E'"


def node_states(lab: Lab) -> dict[str, dict[str, str]] | None:
    """Every node's Slurm state and reason as the controller says; None when the lab has no
    Slurm (``lab slurm`` never ran, or the controller cannot answer: see ``status``)."""
    topology = lab.topology
    if topology is None or not (lab.dir / STATE_FILE).is_file():
        return None
    controller = json.loads((lab.dir / STATE_FILE).read_text())["controller"]
    proc = lab.ssh(controller, SINFO_NODES, timeout=20)
    if proc.returncode != 0:
        return None
    return parse_sinfo_nodes(proc.stdout)


def status(lab: Lab) -> dict[str, Any] | None:
    """``lab status``'s Slurm part: the controller and every node's state, or why not."""
    if not (lab.dir / STATE_FILE).is_file():
        return None
    controller = json.loads((lab.dir / STATE_FILE).read_text())["controller"]
    proc = lab.ssh(controller, SINFO_NODES, timeout=20)
    if proc.returncode != 0:
        return {
            "controller": controller,
            "error": (proc.stderr or proc.stdout).strip()[-300:] or f"rc={proc.returncode}",
            "nodes": {},
        }
    return {"controller": controller, "nodes": parse_sinfo_nodes(proc.stdout)}


def wait_nodes_answer(lab: Lab, cluster: SlurmCluster, timeout: float = READY_TIMEOUT_S) -> None:
    """Bounded wait until sinfo shows every node answering with a valid configuration."""
    from deployer.lab.lab import LabError

    deadline = time.monotonic() + timeout
    last: dict[str, dict[str, str]] = {}
    error = ""
    while time.monotonic() < deadline:
        proc = lab.ssh(cluster.controller.name, SINFO_NODES, timeout=20)
        if proc.returncode == 0:
            last = parse_sinfo_nodes(proc.stdout)
            if all(_ANSWERING.match(last.get(n.name, {}).get("state", "")) for n in cluster.nodes):
                return
        else:
            error = (proc.stderr or proc.stdout).strip()[-200:]
        time.sleep(1.0)
    pending = {
        n.name: last.get(n.name, {"state": "absent", "reason": ""})
        for n in cluster.nodes
        if not _ANSWERING.match(last.get(n.name, {}).get("state", ""))
    }
    detail = ", ".join(
        f"{name} {s['state']}" + (f" ({s['reason']})" if s["reason"] else "")
        for name, s in pending.items()
    )
    raise LabError(
        f"Slurm nodes not answering after {timeout:.0f}s: {detail or error}; see "
        "/var/log/slurm/slurmd.log on the node, /var/log/slurm/slurmctld.log on "
        f"{cluster.controller.name}"
    )
