"""Moving an apt host from one NVIDIA driver branch (or module flavour) to the planned one in one
transaction: ``nvidia_driver_switch``.

Arguments come computed from the GPU plan (``gpu_plan.driver_switch``, deployer/gpu/gpu_plan.py):
``install`` the planned driver (and Fabric Manager) packages as ``name=deb_version``, ``purge``
the packages of other branches or flavours (and their NSCQ libraries), ``unhold`` the held
packages the plan does not hold. A held branch-suffixed package of the old branch, or a held
unversioned one the new branch's packages depend on at another version, makes apt refuse the
planned driver; so the switch unholds them and installs and purges in the same ``apt-get
install`` (``pkg-`` removes, ``--purge`` removes their configuration too), so apt never sees a
host with no driver package at all.

Read side: one ``dpkg-query`` of every package named, each architecture's instance with its
status (``${db:Status-Abbrev}``) and version. Desired: no instance of a ``purge`` package
installed or left as configuration files (a 32-bit ``libnvidia-compute-535:i386`` of the old
branch included, purged by that name), no instance of an ``unhold`` package held, every
``install`` package's native instance (what apt installs for the plain name) at its exact
version. Write side: the one transaction
(the lists updated first when something is installed). Proof: the read again.
"""

from __future__ import annotations

from typing import Any

from deployer.connection import CommandResult
from deployer.dpkg_arch import NATIVE_ARCH_KEY, NATIVE_ARCH_SCRIPT, dpkg_instance
from deployer.modules.base import (
    ArgError,
    HostSession,
    Module,
    Observation,
    Param,
    q,
    register,
    run_checked,
)
from deployer.modules.package import lock_retry, package_names

LOCK_TIMEOUT_S = 300


def package_state(status: str) -> tuple[bool, bool]:
    """(installed or left as configuration files, held) from dpkg's ``${db:Status-Abbrev}``:
    its first letter is the wanted state (``h`` hold), its second the current one; ``un``/``pn``
    (unknown or purge wanted, not installed) is a package that is not there."""
    wanted, current = (status + "  ")[0], (status + "  ")[1]
    present = status.strip() != "" and not (wanted in "up" and current == "n")
    return present, wanted == "h"


def _pin(spec: str) -> tuple[str, str]:
    name, sep, version = spec.partition("=")
    if not sep or not version:
        raise ValueError(spec)
    return name, version


@register
class DriverSwitch(Module):
    """Unhold, purge and install the planned driver in one apt transaction."""

    name = "nvidia_driver_switch"
    params = {
        "install": Param(list, default=[]),
        "purge": Param(list, default=[]),
        "unhold": Param(list, default=[]),
    }

    def check(self, args: dict[str, Any]) -> None:
        for key in ("purge", "unhold"):
            if args[key]:
                args[key] = package_names(key, args[key])
        for spec in args["install"]:
            try:
                package_names("install", [_pin(str(spec))[0]])
            except ValueError:
                raise ArgError("install", f"give name=version, got {spec!r}") from None
        if not (args["install"] or args["purge"] or args["unhold"]):
            raise ArgError("purge", "nothing to switch: give install, purge or unhold")

    def _names(self, args: dict[str, Any]) -> list[str]:
        names = [*args["purge"], *args["unhold"], *(_pin(s)[0] for s in args["install"])]
        return list(dict.fromkeys(names))

    # ---- read side -----------------------------------------------------------------------
    def read_script(self, args: dict[str, Any]) -> str:
        names = " ".join(q(n) for n in self._names(args))
        fmt = q("${Package}:${Architecture}\t${db:Status-Abbrev}\t${Version}\n")
        # dpkg-query exits 1 naming a package it never heard of: that one is simply absent
        return f"{NATIVE_ARCH_SCRIPT}\ndpkg-query -W -f={fmt} -- {names} 2>/dev/null || true"

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        native = ""
        seen: dict[str, tuple[bool, bool, str]] = {}  # "package:arch" -> (present, held, version)
        for line in result.stdout.splitlines():
            if line.startswith(f"{NATIVE_ARCH_KEY}="):
                native = line.partition("=")[2].strip()
                continue
            parts = line.split("\t")
            if len(parts) == 3:
                present, held = package_state(parts[1])
                seen[parts[0]] = (present, held, parts[2] if present else "")

        def instances(names: list[str], which: int) -> list[str]:
            # every architecture's instance: apt-get and apt-mark read a plain name as the
            # native one, so a foreign instance is named with its architecture
            out = []
            for key, state in seen.items():
                name, _, arch = key.partition(":")
                if name in names and state[which]:
                    out.append(name if arch in (native, "all") else key)
            return sorted(out)

        return {
            "installed": instances(args["purge"], 0),
            "held": instances(args["unhold"], 1),
            "versions": {
                name: ((dpkg_instance(seen, name, native) or (False, False, ""))[2] or None)
                for name, _ in map(_pin, args["install"])
            },
        }

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "installed": [],
            "held": [],
            "versions": dict(map(_pin, args["install"])),
        }

    def compare(self, args: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        return {k: (actual[k], v) for k, v in self.desired(args).items() if actual[k] != v}

    # ---- write side ----------------------------------------------------------------------
    def transaction(self, args: dict[str, Any], obs: Observation) -> str:
        """The one shell command of the switch, for the state ``obs`` read."""
        lock = f"-o DPkg::Lock::Timeout={LOCK_TIMEOUT_S}"
        steps = ["export DEBIAN_FRONTEND=noninteractive"]
        if obs.actual["held"]:
            held = " ".join(q(n) for n in obs.actual["held"])
            # a package held by someone else may already be gone: the read after proves it
            steps.append(f"apt-mark unhold -- {held} >/dev/null 2>&1")
        specs = [q(s) for s in args["install"]] + [q(f"{n}-") for n in obs.actual["installed"]]
        if specs:
            opts = (
                f"-y -q {lock} -o Dpkg::Options::=--force-confdef "
                "-o Dpkg::Options::=--force-confold --allow-downgrades --purge"
            )
            install = lock_retry(f"apt-get {opts} install -- {' '.join(specs)}", LOCK_TIMEOUT_S)
            if args["install"]:
                steps.append(f'apt-get -q {lock} update >/dev/null || exit "$?"')
            steps.append(install)
        return "\n".join(steps)

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        if obs.differences:
            run_checked(session, self.transaction(args, obs), timeout=1800)
