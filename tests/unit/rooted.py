"""A read-only check module run through the executor on this machine's shell, its read scripts
asked at their real paths and run under a temporary root (tests of ``boot_loader``,
``module_signing``, ``driver_module``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployer.connection import CommandResult, LocalConnection
from deployer.executor import Executor
from deployer.modules.base import Module
from deployer.plan import HostPlan, HostPlay, PlannedTask
from deployer.results import TaskResult
from deployer.roles import Play

PLAY = Play(name="p", hosts="all", roles=("r",))


class UnderRoot(LocalConnection):
    """This machine's shell; each of ``scripts`` (a module's script for a root: ``script(root)``)
    must be in the command as the module sends it (the real paths), and runs with every path
    under ``root``."""

    def __init__(self, root: str, *scripts: Callable[..., str]) -> None:
        super().__init__("h1")
        self.root = root
        self.scripts = scripts

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        for script in self.scripts:
            assert script() in command  # the module asks the real paths
            command = command.replace(script(), script(self.root))
        return super().run(command, **kwargs)


def converge(
    module: Module, args: dict[str, Any], connection: UnderRoot, check: bool = False
) -> TaskResult:
    """The module's one task on host h1 through the executor (``check``: check mode)."""
    task = PlannedTask("r", module.name, module, module.validate(args), "tasks.yml", 1)
    plan = HostPlan("h1", [HostPlay(PLAY, [task], {}, [])])
    report = Executor(lambda h: connection, check=check).run([plan], (PLAY,))
    (result,) = report.hosts["h1"].tasks
    return result
