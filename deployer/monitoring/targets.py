"""``gpumon-deploy targets``: regenerate and push only the Prometheus file_sd targets files.

It converges the site's Prometheus play with the tag ``targets`` (the role's targets-file tasks
and their directories, nothing else), so a GPU host added to the inventory is scraped by every
replica as soon as its file lands: Prometheus watches the files, no reload and no restart.
``--limit`` narrows the replicas by set intersection with the play's hosts (any pattern Ansible
takes: ``prom01,prom02``, ``all:!prom01``).
"""

from __future__ import annotations

import dataclasses

from deployer.errors import InputError
from deployer.results import RunReport
from deployer.roles import Play
from deployer.session import DeploySession, RunOptions

TAG = "targets"


def is_replica_play(play: Play) -> bool:
    return "prometheus" in play.roles


def load_session(options: RunOptions) -> DeploySession:
    """The command's session: the Prometheus play only, for the replicas ``--limit`` selects
    (refused naming ``--limit`` when it selects none, before any connection)."""
    session = DeploySession.load(
        dataclasses.replace(options, tags=frozenset({TAG})), plan=False, plays=is_replica_play
    )
    session.load_content()
    if not session.plays:
        raise InputError("the site has no play with the prometheus role", key="prometheus")
    replicas = {h for play in session.plays for h in session.play_hosts(play)}
    session.hosts = [h for h in session.hosts if h in replicas]
    if not session.hosts:
        raise InputError(
            f"--limit {options.limit} selects no host of the Prometheus play "
            f"({', '.join(p.hosts for p in session.plays)})",
            key="--limit",
        )
    session.build_plan()
    return session


def push_targets(
    session: DeploySession, *, forks: int = 50, json_output: bool = False
) -> RunReport:
    return session.converge(check=False, diff=False, forks=forks, json_output=json_output)
