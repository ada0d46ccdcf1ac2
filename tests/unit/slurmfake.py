"""A Slurm controller for unit tests: answers the Slurm drain hook's commands (``sinfo``,
``scontrol update``, ``squeue -w``) from a table of nodes and the jobs allocated to them, as
Slurm 22.05 does on the lab (checked there: a drain with jobs reads "draining", without
"drained"; a drain replaces the reason; resume clears both; an unknown node prints nothing)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from deployer.connection import CommandResult


@dataclass
class SlurmNode:
    drain: bool = False
    down: bool = False
    reason: str = ""
    jobs: list[str] = field(default_factory=list)  # job ids allocated to the node

    @property
    def state(self) -> str:
        if self.drain:
            return "draining" if self.jobs else "drained"
        if self.down:
            return "down*"
        return "mixed" if self.jobs else "idle"


class FakeSlurm:
    """A drain connection: ``run`` answers like the commands on a Slurm login node."""

    def __init__(self, *nodes: str) -> None:
        self.nodes = {n: SlurmNode() for n in nodes}
        self.commands: list[str] = []
        self.before: Callable[[str], None] | None = None  # called before each command runs

    def admin_drain(self, node: str, reason: str) -> None:
        self.nodes[node].drain, self.nodes[node].reason = True, reason

    def run(self, command: str, *, stdin=None, timeout=None) -> CommandResult:
        self.commands.append(command)
        if self.before is not None:
            self.before(command)
        if command.startswith("sinfo "):
            node = shlex.split(command)[shlex.split(command).index("-n") + 1]
            n = self.nodes.get(node)
            out = "" if n is None else f"{n.state}|{n.reason or 'none'}\n" * 2  # 2 partitions
            return CommandResult(command, 0, out, "")
        if command.startswith("scontrol update "):
            words = dict(w.split("=", 1) for w in shlex.split(command)[2:])
            n = self.nodes.get(words["nodename"])
            if n is None:
                return CommandResult(command, 1, "", "slurm_update error: Invalid node name")
            if words["state"] == "drain":
                n.drain, n.reason = True, words["reason"]
            elif words["state"] == "resume":
                n.drain, n.down, n.reason = False, False, ""
            return CommandResult(command, 0, "", "")
        m = re.search(r"squeue -h -w (\S+)", command)
        if m:
            n = self.nodes[shlex.split(m.group(1))[0]]
            out = "".join(f"job {j} (alice, RUNNING): train.sh\n" for j in n.jobs)
            return CommandResult(command, 1 if out else 0, out, "")
        return CommandResult(command, 127, "", f"sh: {command.split()[0]}: not found")

    def close(self) -> None:
        pass

    def scontrol(self) -> list[str]:
        return [c for c in self.commands if c.startswith("scontrol")]
