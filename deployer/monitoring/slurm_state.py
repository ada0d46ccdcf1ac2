"""What Slurm says about its GPU nodes, read from its client commands' text (Slurm 22.05).

Four read-only commands, run on a host with Slurm's client commands (``status`` runs them over
its SSH connection pool): the node state and drain reason (``sinfo``), each node's GPUs and
which of them are allocated (``scontrol show node -d -o``), the jobs that hold nodes (``squeue``)
and which GPUs of which node each job holds (``scontrol show job -d -o``). The parsers are tested
on the real output of Slurm 22.05.8 (Debian 12's ``slurm-wlm``), captured from the lab's
slurmctld: ``tests/fixtures/slurm/`` (origin in its ``SOURCES.md``).

Formats, from Slurm's source at tag slurm-22-05-8-1 (SchedMD/slurm 987c99f0):

- ``GresUsed=gpu:h100:3(IDX:0,2-3)``: ``_node_gres_used``, src/common/gres.c:4509-4600: per GRES
  type ``name:type:count(IDX:list)``, comma-separated, ``IDX:N/A`` when none is allocated; the
  index list is ``bit_fmt`` of the node's GRES bitmap (ranges ``a-b``, commas), one bitmap over
  every GPU of the node whatever its type. Without topology (gres.conf with ``Count`` only, no
  ``File=``) there is no ``(IDX:...)`` at all, only counts (``gpu:h100:2``).
- ``Gres=gpu:h100:8`` (optionally ``(S:0-1)``, the sockets the GPUs are bound to).
- job detail, src/api/job_info.c:742-856: after ``JOB_GRES=``, per group of nodes with the same
  allocation ``  Nodes=<hostlist> CPU_IDs=<list> Mem=<MB> GRES=<gpu:type:count(IDX:list),...>``;
  ``GRES=`` is empty once the job ended (the captures' CANCELLED jobs).
- ``sinfo -o %T``: the long state name in lower case with a suffix flag (``*`` not responding,
  ``~`` powered off, ...), ``drained``/``draining`` with the DRAIN flag: node_state_string(),
  src/common/slurm_protocol_defs.c:3558 (what ``deployer.rollout.drain`` reads too).

Free text (job names, commands, reasons) may hold spaces and ``Key=`` look-alikes; the parsers read
only the fields they need and never split a line on blanks: the reason comes last in ``sinfo``'s
line (``%E``), the allocation from each node's ``GresUsed`` (no free text); a job's detail only
says which job holds an allocated GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import product

# The commands (read-only). sinfo prints one line per node and partition; the reason comes last
# because it is free text that may hold '|'.
SINFO = "sinfo -h -N -o '%N|%T|%u|%H|%E'"
NODES = "scontrol show node -d -o"
# jobs that hold their nodes' resources: running, suspended, stopped, or ending (completing)
SQUEUE = "squeue -h -t RUNNING,SUSPENDED,COMPLETING,STOPPED -o '%A|%u|%T|%M|%N'"
JOBS = "scontrol show job -d -o"
COMMANDS = (SINFO, NODES, SQUEUE, JOBS)

GPU = "gpu"
# A GRES type of MIG instances: Slurm (AutoDetect=nvml) schedules each MIG instance as a GPU,
# typed by a substring of its "MIG Profile" such as nvidia_a100_3g.20gb (doc/html/gres.shtml
# "MIG Management", lines 470-495 at slurm-22-05-8-1: ``gres=gpu:a100:1,gpu:a100_3g.20gb:2``);
# the indexes of such a node count MIG devices, not GPUs.
_MIG_TYPE = re.compile(r"\d+g\.\d+gb", re.IGNORECASE)


class SlurmParseError(ValueError):
    """Output that is not what Slurm 22.05 prints (names the command and the line)."""


@dataclass(frozen=True)
class NodeState:
    """A node as ``sinfo`` shows it."""

    name: str
    state: str  # long state name, lower case, with its flag suffix ("idle", "draining", "down*")
    reason: str = ""  # "" when none
    reason_user: str = ""  # who set the reason ("" when none)
    reason_time: str = ""  # when, in the controller's local time (sinfo %H), "" when none


@dataclass(frozen=True)
class GresItem:
    """One ``name[:type][:count][(...)]`` item of a GRES string."""

    name: str
    type: str | None
    count: int
    indexes: frozenset[int] | None  # from (IDX:...); None when the item has no IDX


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs as ``scontrol show node -d`` says: how many, and which are allocated."""

    name: str
    total: int
    types: tuple[str, ...]
    allocated: int
    # the allocated GPUs' indexes; None when Slurm reports counts only (no File= in gres.conf)
    allocated_indexes: frozenset[int] | None

    @property
    def mig_typed(self) -> bool:
        """Slurm schedules MIG instances here (their indexes are not GPU indexes)."""
        return any(_MIG_TYPE.search(t) for t in self.types)


@dataclass(frozen=True)
class Job:
    """A job holding nodes (``squeue``), with the GPUs it holds on each (``scontrol``)."""

    id: str
    user: str
    state: str  # RUNNING, SUSPENDED, COMPLETING, STOPPED
    elapsed_s: int | None  # run time so far (squeue %M); None when Slurm prints none
    nodes: tuple[str, ...]
    gpus: dict[str, frozenset[int]] = field(default_factory=dict)  # node -> GPU indexes


@dataclass(frozen=True)
class SlurmView:
    """Everything ``status`` reads from one Slurm controller."""

    nodes: dict[str, NodeState]
    gpus: dict[str, NodeGpus]
    jobs: dict[str, Job]

    def jobs_on(self, node: str) -> list[Job]:
        return [j for j in self.jobs.values() if node in j.nodes]


# ---------------------------------------------------------------- small grammars


def expand_hostlist(expr: str) -> list[str]:
    """A Slurm hostlist (``gpu[01-03,05],mon01``, ``r[1-2]n[1-2]``) as host names, in order;
    zero padding is kept (``[08-10]`` gives 08, 09, 10)."""
    hosts: list[str] = []
    for part in _split_top(expr.strip(), ","):
        if not part:
            continue
        pieces = re.split(r"(\[[^\]]*\])", part)
        choices: list[list[str]] = []
        for piece in pieces:
            if piece.startswith("[") and piece.endswith("]"):
                choices.append(_expand_range_list(piece[1:-1], part))
            elif "[" in piece or "]" in piece:
                raise SlurmParseError(f"not a Slurm hostlist: {expr!r}")
            else:
                choices.append([piece])
        hosts.extend("".join(p) for p in product(*choices))
    return hosts


def _expand_range_list(body: str, where: str) -> list[str]:
    out: list[str] = []
    for r in body.split(","):
        lo, sep, hi = r.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmParseError(f"not a Slurm hostlist range: [{body}] in {where!r}")
        if not sep:
            out.append(lo)
            continue
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets and parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_index_list(text: str) -> frozenset[int]:
    """``bit_fmt``'s list (``0-2``, ``0,2-3``); ``N/A`` is empty."""
    if text in ("", "N/A"):
        return frozenset()
    out: set[int] = set()
    for r in text.split(","):
        lo, sep, hi = r.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmParseError(f"not a GRES index list: {text!r}")
        out.update(range(int(lo), int(hi) + 1) if sep else (int(lo),))
    return frozenset(out)


_ITEM = re.compile(r"^(?P<spec>[^()]+)(?:\((?P<extra>[^)]*)\))?$")


def parse_gres(text: str) -> list[GresItem]:
    """A GRES string (``Gres=``, ``GresUsed=``, a job's ``GRES=``) as its items; ``(null)``,
    ``N/A`` and empty are none."""
    if text in ("", "(null)", "N/A"):
        return []
    items = []
    for raw in _split_top(text, ","):
        m = _ITEM.match(raw)
        if m is None:
            raise SlurmParseError(f"not a GRES item: {raw!r} in {text!r}")
        name, *rest = m.group("spec").split(":")
        gtype: str | None = None
        count = 1
        if rest and re.fullmatch(r"\d+", rest[-1]):
            count = int(rest.pop())
        if rest:
            gtype = ":".join(rest)
        indexes = None
        extra = m.group("extra") or ""
        if extra.startswith("IDX:"):
            indexes = parse_index_list(extra[4:])
        items.append(GresItem(name, gtype, count, indexes))
    return items


def parse_elapsed(text: str) -> int | None:
    """squeue's ``%M``: ``[days-][hours:]minutes:seconds`` as seconds; None for anything else
    (``INVALID``, ``N/A``)."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if m is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


# ---------------------------------------------------------------- the four commands


def parse_sinfo(text: str) -> dict[str, NodeState]:
    """``SINFO``'s answer: node -> state (the first line of a node in several partitions)."""
    out: dict[str, NodeState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 4)
        if len(parts) != 5 or not parts[0].strip():
            raise SlurmParseError(f"sinfo: not 'node|state|user|time|reason': {line!r}")
        name, state, user, when, reason = (p.strip() for p in parts)
        if name in out:
            continue
        reason = "" if reason in ("none", "(null)") else reason
        out[name] = NodeState(
            name=name,
            state=state.lower(),
            reason=reason,
            reason_user="" if not reason or user == "Unknown" else user,
            reason_time="" if not reason or when == "Unknown" else when,
        )
    return out


_NODE_NAME = re.compile(r"^NodeName=(\S+)")
_FIELD = {k: re.compile(rf"(?:^|\s){k}=(\S*)") for k in ("Gres", "GresUsed")}


def parse_nodes(text: str) -> dict[str, NodeGpus]:
    """``NODES``'s answer: node -> its GPUs (GRES named ``gpu``) and those allocated."""
    out: dict[str, NodeGpus] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _NODE_NAME.match(line)
        if m is None:
            raise SlurmParseError(f"scontrol show node: a line without NodeName=: {line[:80]!r}")
        fields = {}
        for key, pattern in _FIELD.items():
            found = pattern.search(line)
            fields[key] = found.group(1) if found else ""
        gres = [g for g in parse_gres(fields["Gres"]) if g.name == GPU]
        used = [g for g in parse_gres(fields["GresUsed"]) if g.name == GPU]
        with_idx = [g.indexes for g in used if g.indexes is not None]
        indexes = frozenset().union(*with_idx) if with_idx and len(with_idx) == len(used) else None
        out[m.group(1)] = NodeGpus(
            name=m.group(1),
            total=sum(g.count for g in gres),
            types=tuple(g.type for g in gres if g.type),
            allocated=sum(g.count for g in used),
            allocated_indexes=indexes if used else frozenset(),
        )
    return out


def parse_squeue(text: str) -> dict[str, Job]:
    """``SQUEUE``'s answer: job id -> job (nodes expanded from the hostlist)."""
    out: dict[str, Job] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 5 or not parts[0].strip():
            raise SlurmParseError(f"squeue: not 'job|user|state|time|nodes': {line!r}")
        job_id, user, state, elapsed, nodes = (p.strip() for p in parts)
        out[job_id] = Job(
            id=job_id,
            user=user,
            state=state,
            elapsed_s=parse_elapsed(elapsed),
            nodes=tuple(expand_hostlist(nodes)) if nodes else (),
        )
    return out


_JOB_ID = re.compile(r"^JobId=(\d+)\s")
# "  Nodes=gpu[03,05] CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:0)" (job_info.c:808-809, 851)
_DETAIL = re.compile(r"\sNodes=(\S+) CPU_IDs=\S* Mem=\d+ GRES=(\S*)")


def parse_job_gpus(text: str) -> dict[str, dict[str, frozenset[int]]]:
    """``JOBS``'s answer: job id -> node -> the GPU indexes the job holds there (jobs and nodes
    without GPUs left out; "No jobs in the system" is none)."""
    out: dict[str, dict[str, frozenset[int]]] = {}
    for line in text.splitlines():
        m = _JOB_ID.match(line)
        if m is None:
            continue
        per_node: dict[str, frozenset[int]] = {}
        for nodes, gres in _DETAIL.findall(line):
            idx = frozenset().union(
                *(g.indexes for g in parse_gres(gres) if g.name == GPU and g.indexes is not None)
            )
            if idx:
                for n in expand_hostlist(nodes):
                    per_node[n] = per_node.get(n, frozenset()) | idx
        if per_node:
            out[m.group(1)] = per_node
    return out


def view(sinfo: str, nodes: str, squeue: str, jobs: str) -> SlurmView:
    """The four answers (``COMMANDS``' stdout, in order) as one view."""
    gpus_of = parse_job_gpus(jobs)
    held = {
        job_id: Job(j.id, j.user, j.state, j.elapsed_s, j.nodes, gpus_of.get(job_id, {}))
        for job_id, j in parse_squeue(squeue).items()
    }
    return SlurmView(nodes=parse_sinfo(sinfo), gpus=parse_nodes(nodes), jobs=held)
