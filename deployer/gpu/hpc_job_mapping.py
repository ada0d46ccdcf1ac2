"""Job-aware GPU metrics: dcgm-exporter's ``--hpc-job-mapping-dir`` on one GPU host, as the
``dcgm_exporter`` role sets it up (the role variables checked, the exporter versions that can do
it, the values the role reads as ``gpu_plan.hpc_job_mapping``).

What dcgm-exporter does with the directory (NVIDIA/dcgm-exporter, line numbers at 691c927 = tag
4.5.3-4.8.2 unless said otherwise):

- the flag ``--hpc-job-mapping-dir`` / env ``DCGM_HPC_JOB_MAPPING_DIR`` exists from tag
  3.3.6-3.4.2 (``pkg/cmd/app.go:76,238`` @dd3001a; ``app.go:94,288-291`` here);
- at every scrape it lists the directory and reads each file named after a GPU id (``0``, ``1``;
  ``<gpu>.<GPU_I_ID>`` for a MIG instance from 4.5.3-4.8.2, ``hpc.go:98-105,165``; before, the
  integer names ``strconv.Atoi`` takes, ``hpc.go:176`` @b921c57), one job id a line
  (``hpc.go:147-154``), and replaces each series of that GPU by one copy per line with the label
  ``hpc_job`` (``const.go:27``, ``hpc.go:105-121``);
- an empty file leaves the GPU's series unlabelled only from 4.3.1-4.4.0 (``hpc.go:107``
  ``len(jobs) != 0``, NVIDIA/dcgm-exporter fe52755, #533): before, it dropped every series of the
  GPU. The Prolog/Epilog (``roles/dcgm_exporter/files/slurm-dcgm-job-map``) empties a GPU's file
  when its last job ends, because a file removed between the listing and the read fails the whole
  scrape (``hpc.go:80-84``, ``internal/pkg/server/server.go:308-320``), so the role refuses the
  option below 4.3.1-4.4.0, where every GPU that ever ran a job would lose its metrics.

Public API: ``plan(host, variables, exporter_tag) -> dict`` (``InputError`` naming the key).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

from deployer import dcgm_fields
from deployer.errors import InputError

SCHEDULERS = ("slurm",)
SUPPORTED_SINCE = "4.3.1-4.4.0"
INSTANCE_FILES_SINCE = "4.5.3-4.8.2"  # and later: docs/unverified.md#exporter-4-8-3-hpc
#: Under /run: a node that crashed without running its Epilog starts with no stale job.
DEFAULT_DIR = "/run/gpumon/dcgm-job-map"
DEFAULT_HOOK_NAME = "50-gpumon-dcgm-job-map"
#: Paths the exporter's hardened unit cannot see (PrivateTmp=yes, ProtectHome=yes).
HIDDEN_FROM_EXPORTER = ("/tmp", "/var/tmp", "/home", "/root", "/run/user")
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/@+-]*$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

KEY = "dcgm_exporter_hpc_job_mapping"
DIR_KEY = "dcgm_exporter_hpc_job_mapping_dir"
PROLOG_KEY = "dcgm_exporter_slurm_prolog_dir"
EPILOG_KEY = "dcgm_exporter_slurm_epilog_dir"
HOOK_KEY = "dcgm_exporter_slurm_hook_name"
# Every variable plan() reads.
VARS = (KEY, DIR_KEY, PROLOG_KEY, EPILOG_KEY, HOOK_KEY)


def _bad(host: str, variables: Mapping[str, Any], key: str, message: str) -> InputError:
    source = getattr(variables, "source", None)
    line_of = getattr(variables, "line_of", None)
    line = line_of(key) if callable(line_of) else None
    return InputError(f"host {host}: {message}", source=source, line=line, key=key)


def _path(host: str, variables: Mapping[str, Any], key: str, default: str) -> str:
    value = variables.get(key, default)
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not _SAFE_PATH.match(value):
        raise _bad(host, variables, key, f"{value!r} is not an absolute path of plain characters")
    path = posixpath.normpath(value)
    if path == "/" or path.split("/")[1] in ("proc", "sys", "dev"):
        raise _bad(host, variables, key, f"{value!r} cannot hold the job map")
    return path


def _tag_index(tag: str) -> int | None:
    try:
        return dcgm_fields.EXPORTER_TAGS.index(tag)
    except ValueError:
        return None


def plan(host: str, variables: Mapping[str, Any], exporter_tag: str) -> dict[str, Any]:
    """``gpu_plan.hpc_job_mapping`` of one host: ``enabled``, ``scheduler``, ``dir``,
    ``instance_files`` (the exporter reads ``<gpu>.<gi>`` files), ``prolog_dir``,
    ``epilog_dir`` and ``hook_name``."""
    raw = variables.get(KEY, "")
    scheduler = "" if raw in (None, "", False) else str(raw).strip().lower()
    if scheduler in ("false", "no", "off", "none"):
        scheduler = ""
    if scheduler and scheduler not in SCHEDULERS:
        raise _bad(host, variables, KEY, f"{raw!r} is not one of: {', '.join(SCHEDULERS)} "
                   "(or empty: off)")  # fmt: skip
    directory = _path(host, variables, DIR_KEY, DEFAULT_DIR)
    prolog = _path(host, variables, PROLOG_KEY, "")
    epilog = _path(host, variables, EPILOG_KEY, "")
    hook = variables.get(HOOK_KEY, DEFAULT_HOOK_NAME)
    if not isinstance(hook, str) or not _SAFE_NAME.match(hook):
        raise _bad(host, variables, HOOK_KEY, f"{hook!r} is not a plain file name")
    if bool(prolog) != bool(epilog):
        missing = EPILOG_KEY if prolog else PROLOG_KEY
        raise _bad(host, variables, missing, "the Prolog and the Epilog hooks go together: a "
                   "job's line that no Epilog removes labels the GPU's metrics for ever")  # fmt: skip
    out = {
        "enabled": bool(scheduler),
        "scheduler": scheduler or None,
        "dir": directory,
        "instance_files": False,
        "prolog_dir": prolog,
        "epilog_dir": epilog,
        "hook_name": hook,
    }
    if not scheduler:
        return out
    if not directory:
        raise _bad(host, variables, DIR_KEY, "the job-mapping directory cannot be empty")
    if any(directory == h or directory.startswith(h + "/") for h in HIDDEN_FROM_EXPORTER):
        raise _bad(host, variables, DIR_KEY, f"{directory} is hidden from dcgm-exporter's "
                   "hardened unit (PrivateTmp, ProtectHome); choose a path under /run or /var/lib")  # fmt: skip
    index = _tag_index(exporter_tag)
    if index is None or index < dcgm_fields.EXPORTER_TAGS.index(SUPPORTED_SINCE):
        raise _bad(host, variables, KEY, f"dcgm-exporter {exporter_tag} cannot keep an idle "
                   f"GPU's metrics with job mapping on (an emptied GPU file drops them before "
                   f"{SUPPORTED_SINCE}, NVIDIA/dcgm-exporter#533); set dcgm_exporter_version to "
                   f"{SUPPORTED_SINCE} or later")  # fmt: skip
    out["instance_files"] = index >= dcgm_fields.EXPORTER_TAGS.index(INSTANCE_FILES_SINCE)
    return out
