"""GPU faults of a SIMULATED host: written atomically into the host's state file
(``<root>/var/lib/gpusim/state.json``) from outside; the stand-ins re-read it on every call or
scrape, so a fault shows within a second or two without restarting anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from deployer.errors import InputError
from deployer.lab.gpusim.standins import common

FAULT_KINDS: tuple[str, ...] = (
    "gpu-temp",
    "memory-temp",
    "xid",
    "ecc-dbe",
    "gpu-missing",
    "upgrade-validation",
    "gpu-jobs",
)

DIAG_TESTS = ("software", "pcie", "memory", "memory_bandwidth", "diagnostic", "targeted_stress",
              "targeted_power", "memtest", "pulse_test")  # fmt: skip

#: kind -> {param: (type, default)}; a default of None means optional without a value.
PARAMS: dict[str, dict[str, tuple[type, object]]] = {
    "gpu-temp": {"gpu": (int, 0), "value": (int, 95)},
    "memory-temp": {"gpu": (int, 0), "value": (int, 100)},
    "xid": {"gpu": (int, 0), "xid": (int, 79)},
    "ecc-dbe": {"gpu": (int, 0), "count": (int, 1), "row_remap_failure": (bool, False)},
    "gpu-missing": {"gpu": (int, 0)},
    "upgrade-validation": {"gpu": (int, None), "test": (str, "software"), "message": (str, None)},
    "gpu-jobs": {"gpu": (int, 0), "pid": (int, None), "process_name": (str, "python3"),
                 "used_memory_mib": (int, 1024), "gpu_instance": (int, None)},
}  # fmt: skip


def state_path(root: Path) -> Path:
    return Path(root) / common.STATE_FILE.lstrip("/")


def hardware_path(root: Path) -> Path:
    return Path(root) / common.HARDWARE_FILE.lstrip("/")


def empty_state() -> dict:
    return {"simulated": True, "gpus": {}, "xid_events": [], "jobs": []}


def read_state(root: Path) -> dict:
    try:
        st = json.loads(state_path(root).read_text())
    except FileNotFoundError:
        return empty_state()
    base = empty_state()
    base.update(st)
    return base


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _coerce(kind: str, name: str, typ: type, raw: object) -> object:
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("1", "true", "yes", "on"):
            return True
        if str(raw).lower() in ("0", "false", "no", "off"):
            return False
        raise InputError(f"{kind}: expected true or false, got {raw!r}", key=name)
    if typ is int:
        if isinstance(raw, bool):
            raise InputError(f"{kind}: expected an integer, got {raw!r}", key=name)
        try:
            return int(str(raw), 10)
        except ValueError:
            raise InputError(f"{kind}: expected an integer, got {raw!r}", key=name) from None
    return str(raw)


def _resolve(kind: str, params: dict, hw: dict) -> dict:
    if kind not in FAULT_KINDS:
        raise InputError(f"unknown GPU fault kind (known: {', '.join(FAULT_KINDS)})", key=kind)
    spec = PARAMS[kind]
    unknown = sorted(set(params or {}) - set(spec))
    if unknown:
        raise InputError(f"{kind}: unknown parameter (accepted: {', '.join(spec)})", key=unknown[0])
    out = {}
    for name, (typ, default) in spec.items():
        raw = (params or {}).get(name, default)
        out[name] = None if raw is None else _coerce(kind, name, typ, raw)
    gpu_indices = [g["index"] for g in hw.get("gpus", [])]
    gpu = out.get("gpu")
    if gpu is not None and gpu not in gpu_indices:
        raise InputError(f"{kind}: no GPU {gpu} on this host (GPUs: {gpu_indices})", key="gpu")
    if out.get("gpu_instance") is not None:
        desc = next(g for g in hw["gpus"] if g["index"] == gpu)
        ids = [gi["gi_id"] for gi in desc.get("mig") or []]
        if out["gpu_instance"] not in ids:
            where = f"GPU instances: {ids}" if ids else "MIG is off there"
            raise InputError(f"{kind}: GPU {gpu} has no GPU instance {out['gpu_instance']} "
                             f"({where})", key="gpu_instance")  # fmt: skip
    if kind == "memory-temp":
        desc = next(g for g in hw["gpus"] if g["index"] == gpu)
        if not desc.get("memory_sensor", True):
            raise InputError(f"{kind}: GPU {gpu} ({desc['name']}) has no memory temperature "
                             "sensor (nvidia-smi prints N/A, DCGM reads 0)", key="gpu")  # fmt: skip
    if kind == "xid" and not (0 < out["xid"] <= 65535):
        raise InputError(f"{kind}: an XID is a number from 1 to 65535", key="xid")
    if kind == "upgrade-validation" and out["test"] not in DIAG_TESTS:
        raise InputError(
            f"{kind}: unknown diagnostic test (known: {', '.join(DIAG_TESTS)})", key="test"
        )
    return out


def _gpu(st: dict, index: int) -> dict:
    return st["gpus"].setdefault(str(index), {})


def _apply(kind: str, p: dict, st: dict) -> None:
    if kind == "gpu-temp":
        _gpu(st, p["gpu"])["gpu_temp"] = p["value"]
    elif kind == "memory-temp":
        _gpu(st, p["gpu"])["memory_temp"] = p["value"]
    elif kind == "xid":
        st["xid_events"].append({"gpu": p["gpu"], "xid": p["xid"], "time": time.time()})
    elif kind == "ecc-dbe":
        g = _gpu(st, p["gpu"])
        g["ecc_dbe"] = int(g.get("ecc_dbe", 0)) + p["count"]
        if p["row_remap_failure"]:
            g["row_remap_failure"] = True
    elif kind == "gpu-missing":
        # the driver reports XID 79 ("GPU has fallen off the bus") when it loses the GPU
        _gpu(st, p["gpu"])["missing"] = True
        st["xid_events"].append({"gpu": p["gpu"], "xid": 79, "time": time.time()})
    elif kind == "upgrade-validation":
        st["validation_failure"] = {"gpu": p["gpu"], "test": p["test"], "message": p["message"]}
    elif kind == "gpu-jobs":
        pid = p["pid"] if p["pid"] is not None else 424200 + len(st["jobs"])
        job = {"gpu": p["gpu"], "pid": pid, "process_name": p["process_name"],
               "used_memory_mib": p["used_memory_mib"]}  # fmt: skip
        if p["gpu_instance"] is not None:
            job["gpu_instance"] = p["gpu_instance"]
        st["jobs"].append(job)


def _locked_update(root: Path, change: Callable[[dict], None]) -> None:
    path = state_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(".state.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        st = read_state(root)
        change(st)
        _write_atomic(path, st)


def apply_fault(root: Path, kind: str, params: dict) -> None:
    """Inject one GPU fault into the host whose root filesystem is ``root``.

    Raises :class:`InputError` (key = the kind or parameter at fault) for an unknown kind,
    parameter, value or GPU index; nothing is written then.
    """
    try:
        hw = json.loads(hardware_path(root).read_text())
    except FileNotFoundError:
        raise InputError(
            f"not a simulated GPU host (no {common.HARDWARE_FILE})", key=str(root)
        ) from None
    p = _resolve(kind, params or {}, hw)
    _locked_update(root, lambda st: _apply(kind, p, st))


def heal(root: Path) -> None:
    """Undo every GPU fault of the host: its state file returns to the healthy baseline."""

    def reset(st: dict) -> None:
        st.clear()
        st.update(empty_state())

    _locked_update(root, reset)
