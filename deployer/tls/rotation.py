"""Rotation of the tier's basic-auth credential and CA without a blind spot.

A server and its clients sit on different hosts and are converged at different moments of an
``up``, so a new password (or a new CA) written to both in one pass leaves a window where one end
has it and the other not: 401s (or failed handshakes) until the second end catches up. The
controller therefore keeps the credential and CA in force, and a change goes through three steps,
each one a pass of every host of the tier, the next one begun only after the previous pass
converged every host without a failure:

``widen``
    the accepting end takes both: every server's ``basic_auth_users`` holds the old and the new
    user (exporter-toolkit's map user -> bcrypt hash, web/handler.go ``ServeHTTP``,
    prometheus/exporter-toolkit v0.8.2 5b1eab3), every client trusts the old and the new CA (one
    PEM bundle in ``ca.pem``); clients still send the old credential, servers still present
    certificates of the old CA.
``switch``
    the presenting end moves: clients (the replicas' scrape and Alertmanager configs, curl's
    config for the roles' probes, the product's own client) send the new credential, servers
    present certificates of the new CA. Both ends still accept the old one.
``narrow``
    the old credential and CA are dropped: servers accept only the new user, clients trust only
    the new CA. Rendered exactly as a settled state is, so the pass after it changes nothing.

One ``up`` runs the passes one after the other (``deployer/cli.py``); a pass that fails, or an
``up`` limited by ``--limit``/``--tags``/``--check``, leaves the step where it is, and the next
full ``up`` takes it on from there (any step is safe to run again).

exporter-toolkit maps one user to one hash, so the new credential takes the other of two slots:
slot 1 is the user ``<base>`` (``gpumon_basic_auth_username``) with the replicas' password in
``client-password``, slot 2 the user ``<base>-2`` with ``client-password-2``; each rotation moves
to the other slot, so a client's user name and password file change together in one reload.

The record (``rotation.json`` in ``gpumon_tls_dir``, 0600) holds the passwords in force: it is a
secret, like the password file beside it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from deployer.controller_secrets import read_private, write_private
from deployer.secrets import register_secret
from deployer.tls.hashing import new_hash, verifies

RECORD = "rotation.json"
LEGACY_HASH = "basic-auth-password.bcrypt"
STEPS = ("widen", "switch", "narrow")
SETTLED = "settled"
SECOND_SUFFIX = "-2"

_LOCK = threading.RLock()
_VIEWS: dict[tuple[str, str, str, str], View] = {}


@dataclass(frozen=True)
class Credential:
    base: str  # gpumon_basic_auth_username when it was taken
    slot: int  # 1 or 2: the user name (base, base-2) and the clients' password file
    password: str
    hash: str
    ca_pem: str  # the CA (PEM, normalised) clients trust with it

    @property
    def username(self) -> str:
        return self.base if self.slot == 1 else self.base + SECOND_SUFFIX

    @property
    def password_file(self) -> str:
        """The name of the clients' password file of this slot."""
        return "client-password" if self.slot == 1 else "client-password" + SECOND_SUFFIX


@dataclass(frozen=True)
class View:
    """What the hosts get at the present step."""

    step: str
    accepted: dict[str, str]  # user -> bcrypt hash, the servers' basic_auth_users
    client: Credential  # what clients send
    trusted: tuple[str, ...]  # CA PEMs clients trust (a bundle)
    serving_ca: str  # the CA whose certificates servers present
    retiring_ca: str | None  # the other CA while the rotation is on

    @property
    def ca_bundle(self) -> str:
        return "".join(self.trusted)


def normal_pem(pem: str) -> str:
    return "\n".join(line.strip() for line in pem.strip().splitlines() if line.strip()) + "\n"


def _load(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data = json.loads(read_private(path).decode())
    for key in ("active", "next"):
        cred = data.get(key)
        if cred:
            register_secret(cred["password"])
    return data


def _save(path: Path, data: dict[str, Any]) -> None:
    write_private(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), 0o600)


def _cred(data: dict[str, Any] | None) -> Credential | None:
    return Credential(**data) if data else None


def _hash_for(password: str, kept: str | None) -> str:
    return kept if kept and verifies(password, kept) else new_hash(password)


def _other(slot: int) -> int:
    return 2 if slot == 1 else 1


def _state(directory: Path, base: str, password: str, ca_pem: str) -> dict[str, Any]:
    """The record of ``directory``, begun (settled on the desired credential) or moved to
    ``widen`` when what the inventory asks differs from what is in force."""
    path = directory / RECORD
    data = _load(path)
    ca_pem = normal_pem(ca_pem)
    if data is None:
        legacy = directory / LEGACY_HASH
        kept = read_private(legacy).decode().strip() if legacy.exists() else None
        active = Credential(base, 1, password, _hash_for(password, kept), ca_pem)
        data = {"step": SETTLED, "active": asdict(active), "next": None}
        _save(path, data)
        return data
    active = _cred(data["active"])
    assert active is not None
    nxt = _cred(data.get("next"))
    step = data["step"]
    if step in (SETTLED, "narrow"):
        if (active.base, active.password, active.ca_pem) == (base, password, ca_pem):
            return data
        if step == "narrow":
            return data  # finish the rotation under way first; the next one begins after
        cand = Credential(base, _other(active.slot), password, new_hash(password), ca_pem)
        if active.password == password and active.base == base:
            # Only the CA changes: the credential stays in its slot.
            cand = replace(cand, slot=active.slot, hash=active.hash)
        data = {"step": "widen", "active": asdict(active), "next": asdict(cand)}
        _save(path, data)
        return data
    # Still only widened: the new end may change again (no client sends it yet).
    if (
        step == "widen"
        and nxt is not None
        and (nxt.base, nxt.password, nxt.ca_pem) != (base, password, ca_pem)
    ):
        same_pw = active.password == password and active.base == base
        cand = Credential(
            base,
            active.slot if same_pw else _other(active.slot),
            password,
            active.hash if same_pw else _hash_for(password, nxt.hash),
            ca_pem,
        )
        data = {"step": "widen", "active": asdict(active), "next": asdict(cand)}
        _save(path, data)
    return data


def _view(data: dict[str, Any]) -> View:
    active = _cred(data["active"])
    nxt = _cred(data.get("next"))
    assert active is not None
    step = data["step"]
    if nxt is None or step in (SETTLED, "narrow"):
        return View(step, {active.username: active.hash}, active, (active.ca_pem,),
                    active.ca_pem, None)  # fmt: skip
    accepted = {active.username: active.hash, nxt.username: nxt.hash}
    trusted = tuple(dict.fromkeys([active.ca_pem, nxt.ca_pem]))
    if step == "widen":
        return View(step, accepted, active, trusted, active.ca_pem,
                    nxt.ca_pem if nxt.ca_pem != active.ca_pem else None)  # fmt: skip
    return View(step, accepted, nxt, trusted, nxt.ca_pem,
                active.ca_pem if nxt.ca_pem != active.ca_pem else None)  # fmt: skip


def view(directory: Path, base: str, password: str, ca_pem: str) -> View:
    """The present step of ``directory``'s rotation, for the credential and CA the inventory
    asks; computed once per process (:func:`forget` after a step moves)."""
    key = (str(directory), base, password, normal_pem(ca_pem))
    with _LOCK:
        if key not in _VIEWS:
            _VIEWS[key] = _view(_state(directory, base, password, ca_pem))
        return _VIEWS[key]


def forget() -> None:
    with _LOCK:
        _VIEWS.clear()


def directories() -> list[Path]:
    """The directories whose rotation this process has looked at."""
    with _LOCK:
        return sorted({Path(k[0]) for k in _VIEWS})


def step_of(directory: Path) -> str:
    data = _load(directory / RECORD)
    return data["step"] if data else SETTLED


def advance(directory: Path) -> str:
    """Move ``directory``'s rotation one step on (after a pass that converged every host); the
    step it is at now."""
    path = directory / RECORD
    with _LOCK:
        data = _load(path)
        if data is None or data["step"] == SETTLED:
            return SETTLED
        step = data["step"]
        if step == "widen":
            data["step"] = "switch"
        elif step == "switch":
            data = {"step": "narrow", "active": data["next"], "next": None}
        else:
            data["step"] = SETTLED
        _save(path, data)
        _VIEWS.clear()
        return data["step"]


def in_force(directory: Path) -> dict[str, str] | None:
    """The credential clients send now (user and password), from the record; None without one."""
    data = _load(directory / RECORD)
    if data is None:
        return None
    v = _view(data)
    return {"username": v.client.username, "password": v.client.password}
