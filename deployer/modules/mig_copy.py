"""copy_by_mig_mode: a file whose content depends on whether a GPU of the host is in MIG mode.

Whether a GPU is in MIG mode is known only once its driver is loaded: on a host the run installs
the driver on, the facts read before the first play cannot say (no nvidia-smi yet), and a plan
made from them would be corrected only by the next run. So both contents are planned (data, as
every other argument) and the choice is read on the host when the task runs -- by then the
driver play has run -- from ``nvidia-smi --query-gpu=mig.mode.current`` (one line per GPU,
``Enabled``/``Disabled``/``[N/A]``, as in the real H100 MIG capture, ../shared/gpu_reality_fixtures/
nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt). When nvidia-smi cannot answer
(no driver, a driver/library mismatch until the reboot), the file keeps whichever of the two
planned contents it holds, and a new file gets ``content``: an upgrade in flight never flips it.

Arguments: ``dest``, ``content`` (no GPU in MIG mode), ``mig_content`` (a GPU in MIG mode),
``owner``, ``group``, ``mode`` -- written atomically as ``copy`` writes.
"""

from __future__ import annotations

import hashlib
from typing import Any

from deployer.connection import CommandResult
from deployer.modules.base import (
    ContentDiff,
    HostSession,
    Observation,
    Param,
    PrepareContext,
    parse_kv,
    register,
)
from deployer.modules.files import ATTR_PARAMS, Copy, FileAttrs, parse_stat, stat_script

MIG_MODE = "nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader"


@register
class CopyByMigMode(Copy):
    name = "copy_by_mig_mode"
    params = {
        "dest": Param(str, required=True),
        "content": Param(str, required=True),
        "mig_content": Param(str, required=True),
        **ATTR_PARAMS,
    }

    def check(self, args: dict[str, Any]) -> None:
        FileAttrs.check(self, args)  # dest and mode; both contents are required parameters

    def prepare(self, args: dict[str, Any], ctx: PrepareContext) -> dict[str, Any]:
        return args

    def secret_args(self, args: dict[str, Any]) -> set[str]:
        return set()

    def read_script(self, args: dict[str, Any]) -> str:
        return (
            f"{stat_script(args['dest'], with_hash=True)}; "
            f"if m=$({MIG_MODE} 2>/dev/null); then "
            'case "$m" in *Enabled*) echo mig=yes;; *) echo mig=no;; esac; '
            "else echo mig=unknown; fi"
        )

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return {**parse_stat(result), "mig": parse_kv(result.stdout).get("mig", "unknown")}

    def chosen(self, args: dict[str, Any], actual: dict[str, Any]) -> str:
        """The planned content for the GPUs' mode the host reports (see the module docstring)."""
        if actual.get("mig") == "yes":
            return args["mig_content"]
        if actual.get("mig") == "no":
            return args["content"]
        for content in (args["content"], args["mig_content"]):
            if actual.get("sha256") == hashlib.sha256(content.encode("utf-8")).hexdigest():
                return content
        return args["content"]

    def _with_chosen(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
        return {**args, "content": self.chosen(args, actual)}

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        return super().compare(self._with_chosen(args, actual), actual)

    def content_diff(
        self, args: dict[str, Any], session: HostSession, obs: Observation
    ) -> ContentDiff | None:
        return super().content_diff(self._with_chosen(args, obs.actual), session, obs)

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        super().write(session, self._with_chosen(args, obs.actual), obs)
