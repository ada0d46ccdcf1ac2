"""Packages installed by apt or dnf: presence, absence, exact version, latest, hold/versionlock.

State per package is read with one ``dpkg-query`` (``${Status}|${Version}`` of each architecture's
instance; a name without one means the native architecture's, as apt reads it) or ``rpm -q`` call;
the differences are flat keys (``<name>.state``, ``<name>.version``, ``<name>.hold``,
``<name>.latest``) so the report shows exactly what moves. ``update_cache`` refreshes the package
lists before an install; on its own it is a difference only when ``cache_valid_time`` is given and
the lists are older than that (so a second run reports no change).

A version ending in ``*`` matches as a prefix, as apt's ``pkg=1.2*`` does. Held packages that this
task changes are unheld for the one transaction and held again after it; other held packages stay
protected, which ``--allow-change-held-packages`` would not guarantee.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from deployer.connection import CommandResult
from deployer.dpkg_arch import NATIVE_ARCH_KEY, NATIVE_ARCH_SCRIPT, dpkg_instance
from deployer.modules.base import (
    ArgError,
    HostSession,
    Module,
    Observation,
    Param,
    parse_kv,
    q,
    register,
    run_checked,
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+._:~-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9.+:~_-]+\*?$")
# Our own stamp of the last successful ``apt-get update`` (apt's periodic stamp is also read).
APT_STAMP = "/var/lib/apt/lists/.gpumon-update-stamp"
_APT_PERIODIC_STAMP = "/var/lib/apt/periodic/update-success-stamp"
STAMP_COMMAND = f"mkdir -p /var/lib/apt/lists && touch -- {q(APT_STAMP)}"
_INSTALLED = {"installed", "triggers-pending", "triggers-awaited"}
_LOCK_MESSAGES = (
    "Could not get lock",
    "Unable to acquire the dpkg frontend lock",
    "Unable to lock",
)


def package_names(key: str, value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not names:
        raise ArgError(key, "give at least one package name")
    for n in names:
        if not isinstance(n, str) or not _NAME.match(n):
            raise ArgError(key, f"not a package name: {n!r} (give versions with 'version')")
    if len(set(names)) != len(names):
        raise ArgError(key, "a package is named twice")
    return list(names)


def update_command(lock_timeout_s: int) -> str:
    """``apt-get update``, waiting up to ``lock_timeout_s`` for apt's lock; run
    ``STAMP_COMMAND`` after it succeeds."""
    return lock_retry(
        f"apt-get -q -o DPkg::Lock::Timeout={int(lock_timeout_s)} update", lock_timeout_s
    )


def lock_retry(command: str, limit_s: int) -> str:
    """Shell running ``command``, retrying while another process holds the apt/dpkg lock."""
    patterns = "|".join(f"*{q(m)}*" for m in _LOCK_MESSAGES)
    return (
        "waited=0\n"
        "while :; do\n"
        f"  out=$({command} 2>&1); rc=$?\n"
        '  [ "$rc" -eq 0 ] && break\n'
        f"  case $out in {patterns}) ;; *) break ;; esac\n"
        f'  [ "$waited" -ge {int(limit_s)} ] && break\n'
        "  sleep 3; waited=$((waited + 3))\n"
        "done\n"
        'if [ "$rc" -ne 0 ]; then printf \'%s\\n\' "$out" >&2; else printf \'%s\\n\' "$out"; fi\n'
        'exit "$rc"'
    )


@register
class Package(Module):
    """One or more packages in a given state, through apt or dnf."""

    name = "package"
    params = {
        "name": Param((str, list), required=True),
        "state": Param(str, default="present", choices=("present", "absent", "latest")),
        "version": Param(str),
        "hold": Param(bool),
        "manager": Param(str, default="auto", choices=("auto", "apt", "dnf")),
        "update_cache": Param(bool, default=False),
        "cache_valid_time": Param(int),
        "install_recommends": Param(bool),
        "lock_timeout": Param(int, default=300),
    }

    def check(self, args: dict[str, Any]) -> None:
        args["name"] = package_names("name", args["name"])
        version = args.get("version")
        if version is not None:
            if args["state"] != "present":
                raise ArgError("version", "only valid with state: present")
            if not _VERSION.match(version):
                raise ArgError("version", f"not a package version: {version!r}")
        if args.get("hold") is not None and args["state"] == "absent":
            raise ArgError("hold", "cannot hold a package that should be absent")
        if args.get("cache_valid_time") is not None:
            if not args["update_cache"]:
                raise ArgError("cache_valid_time", "only valid with update_cache: true")
            if args["cache_valid_time"] <= 0:
                raise ArgError("cache_valid_time", "must be a positive number of seconds")
        if args["lock_timeout"] < 0:
            raise ArgError("lock_timeout", "must not be negative")

    # ---- read ----------------------------------------------------------------------------
    def read_script(self, args: dict[str, Any]) -> str:
        names = " ".join(q(n) for n in args["name"])
        if args["manager"] == "auto":
            detect = (
                "if command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; "
                "then m=apt; elif command -v dnf >/dev/null 2>&1; then m=dnf; else m=none; fi"
            )
        else:
            detect = f"m={args['manager']}"
        latest = args["state"] == "latest"
        # One dpkg-query for every name: each parses dpkg's whole status file (18 ms on a host of
        # 850 packages, more on a GPU node), and a driver task names several packages. A name
        # dpkg never heard of prints nothing (absent); every architecture's instance prints
        # under "name:arch" (dpkg_instance picks the one apt means).
        fmt = q("pkg.${Package}:${Architecture}=${Status}|${Version}\n")
        apt = [
            NATIVE_ARCH_SCRIPT,
            f"dpkg-query -W -f={fmt} -- {names} 2>/dev/null || true",  # 1: a name not found
        ]
        if latest:
            apt += [
                f"for p in {names}; do",
                "  printf 'candidate.%s=%s\\n' \"$p\" "
                '"$(apt-cache policy -- "$p" 2>/dev/null | sed -n \'s/^ *Candidate: //p\')"',
                "done",
            ]
        if args.get("cache_valid_time") is not None:
            apt.append(
                "printf 'cache_mtime=%s\\n' \"$(stat -c %Y -- "
                f'{q(APT_STAMP)} {q(_APT_PERIODIC_STAMP)} 2>/dev/null | sort -n | tail -n 1)"'
            )
            apt.append("printf 'now=%s\\n' \"$(date +%s)\"")
        dnf = [
            f"for p in {names}; do",
            "  v=$(rpm -q --qf '%{EPOCH}:%{VERSION}-%{RELEASE}' -- \"$p\" 2>/dev/null) || v=",
            '  printf \'rpm.%s=%s\\n\' "$p" "$v"',
        ]
        if latest:
            dnf.append(
                '  dnf -q check-update -- "$p" >/dev/null 2>&1; '
                'printf \'upgradable.%s=%s\\n\' "$p" "$?"'
            )
        dnf.append("done")
        if args.get("hold") is not None:
            dnf.append("dnf -q versionlock list 2>/dev/null | sed 's/^/lock:/'")
        return "\n".join(
            [
                detect,
                "echo manager=$m",
                'if [ "$m" = apt ]; then',
                *apt,
                'elif [ "$m" = dnf ]; then',
                *dnf,
                "fi",
            ]
        )

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        kv = parse_kv(result.stdout)
        manager = kv.get("manager", "none")
        if manager not in ("apt", "dnf"):
            raise ValueError("neither apt (dpkg-query, apt-get) nor dnf found on the host")
        actual: dict[str, Any] = {"manager": manager}
        if manager == "apt":
            instances = {k[4:]: v for k, v in kv.items() if k.startswith("pkg.")}
            for n in args["name"]:
                line = dpkg_instance(instances, n, kv.get(NATIVE_ARCH_KEY, "")) or ""
                status, _, version = line.partition("|")
                words = status.split()
                installed = len(words) == 3 and words[2] in _INSTALLED
                actual[f"{n}.state"] = "present" if installed else "absent"
                actual[f"{n}.version"] = version if installed else None
                actual[f"{n}.hold"] = bool(words) and words[0] == "hold"
                if args["state"] == "latest":
                    candidate = kv.get(f"candidate.{n}", "")
                    actual[f"{n}.candidate"] = candidate
                    actual[f"{n}.latest"] = (
                        installed and candidate not in ("", "(none)") and candidate == version
                    )
            if args.get("cache_valid_time") is not None:
                mtime = int(kv.get("cache_mtime") or 0)
                now = int(kv.get("now") or 0)
                actual["cache_fresh"] = now - mtime < args["cache_valid_time"]
        else:
            locks = [
                line[5:].strip() for line in result.stdout.splitlines() if line.startswith("lock:")
            ]
            for n in args["name"]:
                evr = kv.get(f"rpm.{n}", "")
                installed = bool(evr) and "not installed" not in evr
                actual[f"{n}.state"] = "present" if installed else "absent"
                actual[f"{n}.version"] = _rpm_version(evr) if installed else None
                actual[f"{n}.epoch_version"] = _rpm_epoch_version(evr) if installed else None
                lock = re.compile(rf"^{re.escape(n)}-(\d+:)?\d")
                actual[f"{n}.hold"] = any(lock.match(x) for x in locks)
                if args["state"] == "latest":
                    actual[f"{n}.latest"] = installed and kv.get(f"upgradable.{n}") == "0"
        return actual

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for n in args["name"]:
            if args["state"] == "absent":
                out[f"{n}.state"] = "absent"
                continue
            out[f"{n}.state"] = "present"
            if args.get("version") is not None:
                out[f"{n}.version"] = args["version"]
            if args["state"] == "latest":
                out[f"{n}.latest"] = True
            if args.get("hold") is not None:
                out[f"{n}.hold"] = args["hold"]
        if args.get("cache_valid_time") is not None:
            out["cache_fresh"] = True
        return out

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        diffs: dict[str, tuple[Any, Any]] = {}
        for key, want in self.desired(args).items():
            have = actual.get(key)
            if key.endswith(".version"):
                if actual.get("manager") == "dnf" and ":" in want:
                    have = actual.get(key.replace(".version", ".epoch_version"))
                if have is None or not version_matches(have, want):
                    diffs[key] = (actual.get(key), want)
            elif have != want:
                diffs[key] = (have, want)
        return diffs

    # ---- write ---------------------------------------------------------------------------
    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if not obs.differences:
            return
        if obs.actual["manager"] == "apt":
            self._write_apt(session, args, obs)
        else:
            self._write_dnf(session, args, obs)

    def _changing(self, args: dict[str, Any], obs: Observation) -> tuple[list[str], list[str]]:
        """(packages to install or move, packages to remove) from the differences."""
        install, remove = [], []
        for n in args["name"]:
            moved = any(f"{n}.{k}" in obs.differences for k in ("state", "version", "latest"))
            if not moved:
                continue
            (remove if args["state"] == "absent" else install).append(n)
        return install, remove

    def _write_apt(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        install, remove = self._changing(args, obs)
        lock = f"-o DPkg::Lock::Timeout={int(args['lock_timeout'])}"
        limit = args["lock_timeout"]
        if args["update_cache"] and ("cache_fresh" in obs.differences or install):
            run_checked(session, update_command(limit) + "\n", timeout=900)
            run_checked(session, STAMP_COMMAND)
            if args["state"] == "latest":
                # The fresh lists may name a newer candidate for every package of this task.
                install = list(args["name"])
        env = "DEBIAN_FRONTEND=noninteractive"
        opts = f"-y -q {lock} -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
        if install:
            extra = ""
            if args.get("version") is not None:
                extra += " --allow-downgrades"
            if args.get("install_recommends") is True:
                extra += " --install-recommends"
            elif args.get("install_recommends") is False:
                extra += " --no-install-recommends"
            specs = " ".join(
                q(f"{n}={args['version']}" if args.get("version") else n) for n in install
            )
            held = [n for n in install if obs.actual.get(f"{n}.hold")]
            cmd = f"{env} apt-get {opts}{extra} install -- {specs}"
            run_checked(session, _around_hold(cmd, held, limit, rehold=True), timeout=1800)
        if remove:
            held = [n for n in remove if obs.actual.get(f"{n}.hold")]
            cmd = f"{env} apt-get {opts} remove -- {' '.join(q(n) for n in remove)}"
            run_checked(session, _around_hold(cmd, held, limit, rehold=False), timeout=1800)
        if args.get("hold") is not None:
            flip = [n for n in args["name"] if f"{n}.hold" in obs.differences]
            # An install above re-held what was held; only the still-differing ones move now.
            if flip:
                verb = "hold" if args["hold"] else "unhold"
                names = " ".join(q(n) for n in flip)
                run_checked(session, lock_retry(f"apt-mark {lock} {verb} -- {names}", limit))

    def _write_dnf(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        install, remove = self._changing(args, obs)
        refresh = " --refresh" if args["update_cache"] else ""
        if install:
            specs = " ".join(
                q(f"{n}-{args['version']}" if args.get("version") else n) for n in install
            )
            held = [n for n in install if obs.actual.get(f"{n}.hold")]
            verb = "upgrade" if args["state"] == "latest" else "install"
            cmd = f"dnf -y{refresh} {verb} -- {specs}"
            if held:
                names = " ".join(q(n) for n in held)
                cmd = (
                    f"dnf -y -q versionlock delete -- {names} >/dev/null && {{ {cmd}; rc=$?; "
                    f"dnf -y -q versionlock add -- {names} >/dev/null; exit $rc; }}"
                )
            run_checked(session, cmd, timeout=1800)
        if remove:
            run_checked(session, f"dnf -y remove -- {' '.join(q(n) for n in remove)}", timeout=1800)
        if args.get("hold") is not None:
            flip = [n for n in args["name"] if f"{n}.hold" in obs.differences]
            if flip:
                verb = "add" if args["hold"] else "delete"
                run_checked(session, f"dnf -y versionlock {verb} -- {' '.join(q(n) for n in flip)}")


def _around_hold(cmd: str, held: list[str], limit_s: int, *, rehold: bool) -> str:
    """Unhold ``held`` for this one apt transaction (and hold them again afterwards)."""
    if not held:
        return lock_retry(cmd, limit_s)
    names = " ".join(q(n) for n in held)
    lock = f"-o DPkg::Lock::Timeout={int(limit_s)}"
    script = f"apt-mark {lock} unhold -- {names} >/dev/null || exit $?\n"
    inner = lock_retry(cmd, limit_s).replace('exit "$rc"', "")
    script += inner + "\n"
    if rehold:
        script += f"apt-mark {lock} hold -- {names} >/dev/null\n"
    return script + 'exit "$rc"'


def version_matches(have: str, want: str) -> bool:
    if want.endswith("*"):
        return fnmatch.fnmatchcase(have, want.replace("[", "[[]"))
    return have == want


def _rpm_version(evr: str) -> str:
    """'0:1.2-3.el9' or '(none):1.2-3.el9' -> '1.2-3.el9'."""
    return evr.split(":", 1)[1] if ":" in evr else evr


def _rpm_epoch_version(evr: str) -> str:
    epoch, _, rest = evr.partition(":")
    return f"{'0' if epoch == '(none)' else epoch}:{rest}"
