"""``gpumon-deploy targets``: regenerate and push only the Prometheus file_sd targets files.

It converges the site's Prometheus play with the tag ``targets`` (the role's targets-file tasks
and their directories, nothing else), so a GPU host added to the inventory is scraped by every
replica as soon as its file lands: Prometheus watches the files, no reload and no restart.
"""

from __future__ import annotations

from pathlib import Path

from deployer.errors import InputError
from deployer.results import RunReport
from deployer.roles import load_site
from deployer.session import DEFAULT_SITE, DeploySession, RunOptions

TAG = "targets"


def replica_pattern(site: Path | None, limit: str | None) -> str:
    """The host pattern of the site's Prometheus play, narrowed by ``--limit``."""
    play = next((p for p in load_site(site or DEFAULT_SITE) if "prometheus" in p.roles), None)
    if play is None:
        raise InputError("the site has no play with the prometheus role", key="prometheus")
    return play.hosts if not limit else f"{play.hosts}:&{limit}"


def push_targets(
    inventory: Path,
    *,
    limit: str | None = None,
    extra_vars: list[str] | None = None,
    site: Path | None = None,
    forks: int = 50,
    json_output: bool = False,
) -> RunReport:
    session = DeploySession.load(
        RunOptions(
            inventory=inventory,
            limit=replica_pattern(site, limit),
            extra_vars=list(extra_vars or []),
            tags=frozenset({TAG}),
            site=site,
        )
    )
    return session.converge(check=False, diff=False, forks=forks, json_output=json_output)
