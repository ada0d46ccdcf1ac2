"""Package repositories with their signing keys: apt sources (+ keyring), apt pins, dnf .repo files.

An apt repository is a deb822 ``.sources`` file (or a one-line ``.list``) in
``/etc/apt/sources.list.d`` whose ``Signed-By`` names a keyring under ``/etc/apt/keyrings`` that
this module installs (0644, dearmored). The key comes inline (``key``) or from ``key_url``, fetched
on the host by the read side: the bytes that were hashed are the bytes installed, so what the
report compared is exactly what lands. ``trusted=yes`` is refused. A change to either file runs
``apt-get update`` for that one source.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any

from deployer.connection import CommandResult
from deployer.modules.base import (
    ArgError,
    ContentDiff,
    HostSession,
    Module,
    Observation,
    Param,
    parse_kv,
    q,
    register,
    run_checked,
)
from deployer.modules.files import atomic_write_script, parse_stat, stat_script
from deployer.modules.package import lock_retry
from deployer.modules.probe import SectionedRead
from deployer.modules.readout import as_result, sections

SOURCES_DIR = "/etc/apt/sources.list.d"
KEYRING_DIR = "/etc/apt/keyrings"
PREFERENCES_DIR = "/etc/apt/preferences.d"
YUM_REPOS_DIR = "/etc/yum.repos.d"
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ROOT_644 = {"owner": "root", "group": "root", "mode": "644"}
_MAX_KEY_BYTES = 1 << 20


class BadKey(ValueError):
    """A signing key that is neither binary OpenPGP nor an ASCII-armored public key block."""


def dearmor(data: bytes) -> bytes:
    """Binary OpenPGP key material from an ASCII-armored or already-binary key (as gpg --dearmor).

    Every ``PUBLIC KEY BLOCK`` in the text is decoded and concatenated; the CRC24 line is checked.
    """
    if b"-----BEGIN PGP" not in data:
        if not data or not data[0] & 0x80:
            raise BadKey("key is neither binary OpenPGP nor ASCII-armored")
        return data
    text = data.decode("ascii", "replace").replace("\r", "")
    blocks = re.findall(
        r"-----BEGIN PGP PUBLIC KEY BLOCK-----\n(.*?)-----END PGP PUBLIC KEY BLOCK-----",
        text,
        re.S,
    )
    if not blocks:
        raise BadKey("armored text holds no PGP PUBLIC KEY BLOCK")
    out = b""
    for block in blocks:
        lines = [x.strip() for x in block.split("\n")]
        # Armor headers ("Version: ...") come first; base64 never holds a colon.
        while lines and ":" in lines[0]:
            lines.pop(0)
        body, crc = [], None
        for line in lines:
            if not line:
                continue
            if line.startswith("="):
                crc = line[1:]
                break
            body.append(line)
        try:
            raw = base64.b64decode("".join(body), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadKey(f"bad base64 in armored key: {exc}") from None
        if crc is not None and base64.b64decode(crc) != _crc24(raw).to_bytes(3, "big"):
            raise BadKey("armored key checksum does not match")
        out += raw
    return out


def _crc24(data: bytes) -> int:
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def _file_name(key: str, value: str) -> None:
    if not _FILE_NAME.match(value):
        raise ArgError(key, f"must be a plain file name (letters, digits, _ . -), got {value!r}")


def _as_list(key: str, value: Any) -> list[str]:
    items = value.split() if isinstance(value, str) else list(value)
    for x in items:
        if not isinstance(x, str) or not x or any(c.isspace() for c in x):
            raise ArgError(key, f"not a single word: {x!r}")
    return items


def _url(key: str, value: str) -> None:
    if not re.match(r"^(https?|file|ftp)://\S+$", value):
        raise ArgError(key, f"not a URL: {value!r}")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_state(prefix: str, actual: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in actual.items()}


def _managed_file_state(content: bytes) -> dict[str, Any]:
    return {"state": "file", "sha256": _sha(content), **_ROOT_644}


@register
class AptRepository(Module):
    """An apt source in sources.list.d with its signing keyring; never trusted=yes."""

    name = "apt_repository"
    params = {
        "name": Param(str, required=True),
        "uris": Param((str, list), required=True),
        "suites": Param((str, list), required=True),
        "components": Param((str, list)),
        "types": Param((str, list), default="deb"),
        "architectures": Param((str, list)),
        "key_url": Param(str),
        "key": Param(str),
        "format": Param(str, default="deb822", choices=("deb822", "one-line")),
        "state": Param(str, default="present", choices=("present", "absent")),
        "update_cache": Param(bool, default=True),
        "trusted": Param((bool, str)),
        "lock_timeout": Param(int, default=300),
    }

    def check(self, args: dict[str, Any]) -> None:
        if args.get("trusted") is not None:
            raise ArgError("trusted", "refused: a repository must be verified by its signing key")
        _file_name("name", args["name"])
        for key in ("uris", "suites", "components", "types", "architectures"):
            if args.get(key) is not None:
                args[key] = _as_list(key, args[key])
        for u in args["uris"]:
            _url("uris", u)
        if not set(args["types"]) <= {"deb", "deb-src"}:
            raise ArgError("types", "must be deb and/or deb-src")
        suites_flat = [s for s in args["suites"] if s.endswith("/")]
        if suites_flat and args.get("components"):
            raise ArgError("components", "a flat suite (ending in /) takes no components")
        if not suites_flat and not args.get("components"):
            raise ArgError("components", "required unless the suite is flat (ends in /)")
        if args["format"] == "one-line" and (len(args["uris"]) > 1 or len(args["suites"]) > 1):
            raise ArgError("format", "one-line format takes one URI and one suite")
        if args["state"] == "present":
            if (args.get("key") is None) == (args.get("key_url") is None):
                raise ArgError("key_url", "give exactly one of key_url or key")
            if args.get("key_url") is not None:
                _url("key_url", args["key_url"])
            if args.get("key") is not None:
                try:
                    dearmor(args["key"].encode("utf-8"))
                except BadKey as exc:
                    raise ArgError("key", str(exc)) from None

    # ---- paths and content ---------------------------------------------------------------
    def keyring_path(self, args: dict[str, Any]) -> str:
        return f"{KEYRING_DIR}/{args['name']}.gpg"

    def source_path(self, args: dict[str, Any]) -> str:
        ext = "sources" if args["format"] == "deb822" else "list"
        return f"{SOURCES_DIR}/{args['name']}.{ext}"

    def source_content(self, args: dict[str, Any]) -> str:
        keyring = self.keyring_path(args)
        if args["format"] == "one-line":
            opts = [f"signed-by={keyring}"]
            if args.get("architectures"):
                opts.insert(0, "arch=" + ",".join(args["architectures"]))
            lines = [
                f"{t} [{' '.join(opts)}] {args['uris'][0]} {args['suites'][0]}"
                + "".join(f" {c}" for c in args.get("components") or [])
                for t in args["types"]
            ]
            return "\n".join(lines) + "\n"
        fields = [
            ("Types", " ".join(args["types"])),
            ("URIs", " ".join(args["uris"])),
            ("Suites", " ".join(args["suites"])),
        ]
        if args.get("components"):
            fields.append(("Components", " ".join(args["components"])))
        if args.get("architectures"):
            fields.append(("Architectures", " ".join(args["architectures"])))
        fields.append(("Signed-By", keyring))
        return "".join(f"{k}: {v}\n" for k, v in fields)

    # ---- read ----------------------------------------------------------------------------
    def read_script(self, args: dict[str, Any]) -> str:
        parts = [
            ("keyring", stat_script(self.keyring_path(args), with_hash=True)),
            ("source", stat_script(self.source_path(args), with_hash=True)),
        ]
        if args["state"] == "present" and args.get("key_url"):
            fetch = (
                f"k=$(curl -fsSL --max-time 60 --max-filesize {_MAX_KEY_BYTES} -- "
                f'{q(args["key_url"])} | base64 -w0) && [ -n "$k" ] '
                "&& printf 'key=%s\\n' \"$k\" || echo key_error=1"
            )
            parts.append(("fetch", fetch))
        return SectionedRead(parts)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        parts = sections(result.stdout)
        actual = {
            **_file_state("keyring", parse_stat(as_result(parts.get("keyring", "")))),
            **_file_state("source", parse_stat(as_result(parts.get("source", "")))),
        }
        if args["state"] == "present" and args.get("key_url"):
            fetched = parse_kv(parts.get("fetch", ""))
            if "key" not in fetched:
                raise ValueError(f"cannot fetch the signing key from {args['key_url']} on the host")
            try:
                key = dearmor(base64.b64decode(fetched["key"]))
            except (BadKey, binascii.Error) as exc:
                raise ValueError(f"key from {args['key_url']}: {exc}") from None
            # The key travels with the observation to the write side (nothing is kept on the
            # module between calls); only its digest is compared and shown.
            actual["fetched_key"] = key
            actual["fetched_key.sha256"] = _sha(key)
        return actual

    def _key(self, args: dict[str, Any], actual: dict[str, Any]) -> bytes:
        if args.get("key") is not None:
            return dearmor(args["key"].encode("utf-8"))
        return actual["fetched_key"]

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        if args["state"] == "absent":
            return {"keyring.state": "absent", "source.state": "absent"}
        source = self.source_content(args).encode("utf-8")
        return _file_state("source", _managed_file_state(source))

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        want = self.desired(args)
        if args["state"] == "present":
            key = self._key(args, actual)
            want.update(_file_state("keyring", _managed_file_state(key)))
        return {k: (actual.get(k), v) for k, v in want.items() if actual.get(k) != v}

    def content_diff(
        self, args: dict[str, Any], session: HostSession, obs: Observation
    ) -> ContentDiff | None:
        if args["state"] == "absent" or "source.sha256" not in obs.differences:
            return None
        before = None
        if obs.actual.get("source.state") == "file":
            res = session.run(f"cat -- {q(self.source_path(args))}")
            before = res.stdout if res.rc == 0 else None
        return ContentDiff(self.source_path(args), before, self.source_content(args))

    # ---- write ---------------------------------------------------------------------------
    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if not obs.differences:
            return
        keyring, source = self.keyring_path(args), self.source_path(args)
        if args["state"] == "absent":
            run_checked(session, f"rm -f -- {q(source)} {q(keyring)}")
            return
        if any(k.startswith("keyring.") for k in obs.differences):
            run_checked(session, f"mkdir -p -m 0755 -- {q(KEYRING_DIR)}")
            run_checked(
                session, atomic_write_script(keyring, _ROOT_644), stdin=self._key(args, obs.actual)
            )
        if any(k.startswith("source.") for k in obs.differences):
            run_checked(
                session,
                atomic_write_script(source, _ROOT_644),
                stdin=self.source_content(args).encode("utf-8"),
            )
        if args["update_cache"]:
            run_checked(session, self.update_command(args), timeout=900)

    def update_command(self, args: dict[str, Any]) -> str:
        """``apt-get update`` of this one source (other sources' lists are left as they are)."""
        rel = self.source_path(args).removeprefix("/etc/apt/")
        lock = f"-o DPkg::Lock::Timeout={int(args['lock_timeout'])}"
        cmd = (
            f"apt-get -q {lock} -o Dir::Etc::sourcelist={q(rel)} "
            "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 update"
        )
        return lock_retry(cmd, args["lock_timeout"])


class _ManagedText(Module):
    """A root-owned 0644 text file whose whole content this module renders."""

    write_then_read = True  # one atomic replace per write

    def path(self, args: dict[str, Any]) -> str:
        raise NotImplementedError

    def content(self, args: dict[str, Any]) -> str:
        raise NotImplementedError

    def read_script(self, args: dict[str, Any]) -> str:
        return stat_script(self.path(args), with_hash=True)

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        return parse_stat(result)

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        if args["state"] == "absent":
            return {"state": "absent"}
        return _managed_file_state(self.content(args).encode("utf-8"))

    def content_diff(
        self, args: dict[str, Any], session: HostSession, obs: Observation
    ) -> ContentDiff | None:
        if args["state"] == "absent" or "sha256" not in obs.differences:
            return None
        before = None
        if obs.actual.get("state") == "file":
            res = session.run(f"cat -- {q(self.path(args))}")
            before = res.stdout if res.rc == 0 else None
        return ContentDiff(self.path(args), before, self.content(args))

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if not obs.differences:
            return
        path = self.path(args)
        if args["state"] == "absent":
            run_checked(session, f"rm -f -- {q(path)}")
            return
        run_checked(
            session, atomic_write_script(path, _ROOT_644), stdin=self.content(args).encode("utf-8")
        )


@register
class AptPreferences(_ManagedText):
    """An apt pin in /etc/apt/preferences.d: packages pinned by version, origin or release."""

    name = "apt_preferences"
    params = {
        "name": Param(str, required=True),
        "package": Param((str, list), default="*"),
        "pin": Param(str),
        "priority": Param(int),
        "state": Param(str, default="present", choices=("present", "absent")),
    }

    def check(self, args: dict[str, Any]) -> None:
        _file_name("name", args["name"])
        args["package"] = _as_list("package", args["package"])
        if args["state"] == "absent":
            return
        for key in ("pin", "priority"):
            if args.get(key) is None:
                raise ArgError(key, "required when state is present")
        if not re.match(r"^(version|origin|release) \S.*$", args["pin"]) or "\n" in args["pin"]:
            raise ArgError("pin", "must be 'version V', 'origin HOST' or 'release a=..,o=..'")

    def path(self, args: dict[str, Any]) -> str:
        return f"{PREFERENCES_DIR}/{args['name']}.pref"

    def content(self, args: dict[str, Any]) -> str:
        return (
            f"Package: {' '.join(args['package'])}\n"
            f"Pin: {args['pin']}\n"
            f"Pin-Priority: {args['priority']}\n"
        )


@register
class DnfRepository(_ManagedText):
    """A dnf/yum repository in /etc/yum.repos.d with gpgcheck=1 and its gpgkey."""

    name = "dnf_repository"
    params = {
        "name": Param(str, required=True),
        "description": Param(str),
        "baseurl": Param(str, required=True),
        "gpgkey": Param(str),
        "enabled": Param(bool, default=True),
        "repo_gpgcheck": Param(bool, default=False),
        "gpgcheck": Param((bool, int, str)),
        "state": Param(str, default="present", choices=("present", "absent")),
    }

    def check(self, args: dict[str, Any]) -> None:
        if args.get("gpgcheck") is not None:
            raise ArgError("gpgcheck", "always 1 and not settable: packages must be verified")
        _file_name("name", args["name"])
        if args["state"] == "present":
            _url("baseurl", args["baseurl"])
            if args.get("gpgkey") is None:
                raise ArgError("gpgkey", "required: the key that signs the repository's packages")
            _url("gpgkey", args["gpgkey"])
        for key in ("description",):
            if args.get(key) is not None and "\n" in args[key]:
                raise ArgError(key, "must be one line")

    def path(self, args: dict[str, Any]) -> str:
        return f"{YUM_REPOS_DIR}/{args['name']}.repo"

    def content(self, args: dict[str, Any]) -> str:
        return (
            f"[{args['name']}]\n"
            f"name={args.get('description') or args['name']}\n"
            f"baseurl={args['baseurl']}\n"
            f"enabled={int(args['enabled'])}\n"
            "gpgcheck=1\n"
            f"repo_gpgcheck={int(args['repo_gpgcheck'])}\n"
            f"gpgkey={args['gpgkey']}\n"
        )
