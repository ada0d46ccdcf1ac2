"""known_hosts, read as OpenSSH and paramiko read it, once per run for a whole fleet.

``deployer.connection`` verifies every host key against this index: ``KnownHosts`` (one pass over
the file, a key object built only for the host looked up, ``@revoked`` honoured), and
``PerContent``, the per-file cache shared by every connection of a run (the private keys use it
too).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FIELDS = re.compile(r" |\t")


class PerContent:
    """One value per file and content (modification time and size), made by ``load`` once and
    shared by every connection of the run; None for a file that cannot be read."""

    def __init__(self, load: Callable[[Path], Any]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._values: dict[str, tuple[tuple[int, int], Any]] = {}

    def get(self, path: Path) -> Any:
        try:
            st = path.stat()
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._values.get(str(path))
            if hit is not None and hit[0] == stamp:
                return hit[1]
            value = self._load(path)
            self._values[str(path)] = (stamp, value)
            return value


@dataclass(frozen=True)
class KnownHosts:
    """A known_hosts file indexed by host name, read as paramiko's ``HostKeys`` reads it (the
    first three fields split on one space or tab; names matched exactly or, ``|1|salt|hash``, by
    HMAC-SHA1), with two differences that make a fleet's file cheap: one pass over the lines,
    and a key object built only for the host looked up. ``paramiko.HostKeys`` builds one for
    every line and, loading, looks every name up among the entries read so far: a file of 1,000
    hosts cost each run 0.4 CPU-seconds, and twenty-five times that at 5,000 (bench/README.md,
    "Round four"). Where ``HostKeys`` raises and reads nothing (a key type it cannot verify, a
    marker line), that line alone is skipped.

    One marker is honoured, as OpenSSH honours it and paramiko does not: a key on a
    ``@revoked`` line whose host patterns match the host (``*``, ``?``, ``!`` negation, comma
    lists, hashed names) is never trusted for it, even where a plain line records the same key
    (OpenSSH's hostfile.c, ``check_key_not_revoked``: openbsd/src, usr.bin/ssh/hostfile.c at
    001c105671b296bf1ff898be112cd21b50b2e7d8). ``@cert-authority`` lines are skipped: host
    certificates are not supported, so a host known only by its CA is unknown."""

    plain: dict[str, list[tuple[str, bytes]]]  # name -> [(key type, key bytes)], file order
    hashed: list[tuple[bytes, bytes, str, bytes]]  # (salt, HMAC-SHA1 of the name, type, key)
    revoked: list[tuple[str, bytes, int]] = field(default_factory=list)  # (hosts, key, line)

    @classmethod
    def parse(cls, text: str) -> KnownHosts:
        plain: dict[str, list[tuple[str, bytes]]] = {}
        hashed: list[tuple[bytes, bytes, str, bytes]] = []
        revoked: list[tuple[str, bytes, int]] = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line[0] == "#":
                continue
            marker = ""
            if line[0] == "@":
                marker, _, line = line.partition(" ")
                line = line.strip()
                if marker != "@revoked":
                    continue
            fields = _FIELDS.split(line)
            if len(fields) < 3:
                continue
            names, key_type, body = fields[:3]
            try:
                blob = base64.b64decode(body, validate=False)
            except (ValueError, binascii.Error):
                continue
            if marker:
                revoked.append((names, blob, number))
                continue
            for name in names.split(","):
                if name.startswith("|1|"):
                    try:
                        salt, digest = (base64.b64decode(x) for x in name[3:].split("|", 1))
                    except (ValueError, binascii.Error):
                        continue
                    hashed.append((salt, digest, key_type, blob))
                elif name:
                    plain.setdefault(name, []).append((key_type, blob))
        return cls(plain, hashed, revoked)

    def revoked_line(self, name: str, key: Any) -> int | None:
        """The line of the ``@revoked`` entry that revokes ``key`` for ``name``, if any."""
        if not self.revoked:
            return None
        blob = key.asbytes()
        for hosts, revoked_blob, number in self.revoked:
            if revoked_blob == blob and hosts_match(name, hosts):
                return number
        return None

    def lookup(self, name: str) -> dict[str, Any]:
        """The keys recorded for ``name`` (an address, or ``[address]:port``): key type -> key,
        the first line of each type winning, as in ``paramiko.HostKeys.lookup``."""
        found = list(self.plain.get(name, ()))
        if self.hashed:
            raw = name.encode()
            for salt, digest, key_type, blob in self.hashed:
                if hmac.compare_digest(hmac.new(salt, raw, hashlib.sha1).digest(), digest):
                    found.append((key_type, blob))
        if self.revoked:  # a revoked key recorded on a plain line too is not trusted
            found = [(t, b) for t, b in found if not self._is_revoked(name, b)]
        keys: dict[str, Any] = {}
        if not found:
            return keys
        # paramiko is imported by deployer.connection first, its way (without invoke); a lookup
        # only ever runs for a connection, so this finds it there
        import paramiko

        for key_type, blob in found:
            try:
                key = paramiko.PKey.from_type_string(key_type, blob)
            except (paramiko.SSHException, paramiko.pkey.UnknownKeyType, ValueError, TypeError):
                continue  # a type paramiko cannot verify (a FIDO key): no key, as in paramiko
            keys.setdefault(key.get_name(), key)
        return keys

    def _is_revoked(self, name: str, blob: bytes) -> bool:
        return any(b == blob and hosts_match(name, hosts) for hosts, b, _ in self.revoked)


def hosts_match(name: str, hosts: str) -> bool:
    """Whether the host field of a known_hosts line names ``name``, as OpenSSH's
    ``match_maybe_hashed`` and ``match_hostname`` read it: one hashed name (``|1|salt|hash``),
    or a comma list of patterns (``*`` any run, ``?`` one character, case-insensitive) where a
    matching ``!pattern`` excludes the name whatever else matches."""
    if hosts.startswith("|1|"):
        try:
            salt, digest = (base64.b64decode(x) for x in hosts[3:].split("|", 1))
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)
    name = name.lower()
    matched = False
    for pattern in hosts.lower().split(","):
        negated = pattern.startswith("!")
        if _host_pattern(pattern[1:] if negated else pattern).fullmatch(name):
            if negated:
                return False
            matched = True
    return matched


@functools.lru_cache(maxsize=256)
def _host_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(
        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern
    ), re.DOTALL)  # fmt: skip


def read_known_hosts(path: Path) -> KnownHosts | None:
    """``path`` read as a known_hosts file, or None if there is none.

    Read once per content and shared by every connection of the run: each connection reading
    the whole file cost O(hosts^2) for a fleet (bench/README.md). Each client gets only its
    host's entries, as verification looks up no others.
    """
    return _KNOWN_HOSTS.get(path)


_KNOWN_HOSTS = PerContent(lambda path: KnownHosts.parse(path.read_text(errors="replace")))
