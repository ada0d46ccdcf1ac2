"""Whether every package a rollout installs can be had on its host, asked before any host is
touched.

``upgrade-driver`` drains a host, waits for its jobs, silences it and stops its GPU daemons before
it installs; a version the host's package sources do not offer (a mirror of an air-gapped cluster
not synced yet, a ``--to`` of a release the mirror never carried) failed only at the install, the
node drained and its jobs sent elsewhere for nothing. Now the run's preflight asks each
Debian-family host that has anything to install what its sources offer, ``apt-cache policy`` of
every package of its plan (read-only), and refuses the run (exit 2, nothing drained, silenced or
stopped) naming the host, each package at the version it needs and the versions its sources do
offer. A host without the headers of its running kernel, or of the newer installed kernel
Debian's dkms also builds for, is asked for them too (``gpu_plan.kernel_headers_packages``: the
driver role installs them before the driver, since DKMS builds its module against them and
Debian's dkms skips the build without them, the install succeeding with no module).

Asked in the same round trip: the free space the install needs (``free_space.py``: a host with
too little is refused, also in ``--check``), and ``dpkg --audit``. Packages dpkg left
half-installed (an install interrupted, a maintainer script that failed) make apt refuse every
install until they are finished, so a host with any is refused too (``dpkg-unfinished``, also in ``--check``: that state
is exact), naming them and ``dpkg --configure -a``.

A host's package lists may be older than its sources: where a needed version is not in them, the
lists are refreshed (``apt-get update``, what the install step does first anyway; no package
changes) and read again, so only what the sources themselves lack is refused. ``--check`` does not
refresh: what its lists lack is a note, not a refusal.

Not asked: a host whose NVIDIA repository is not configured yet (the install step configures it
first; then what it offers is known only there), and RPM-family hosts: no host of the lab runs
dnf to hold an answer of ``dnf list --showduplicates`` to, so there the install step still finds
out (README, "Who changes a GPU host's driver").
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from deployer.connection import CommandResult
from deployer.errors import HostUnreachable
from deployer.executor import DEFAULT_FORKS
from deployer.gpu.gpu_plan import HEADERS_COMPONENT, HEADERS_VAR
from deployer.gpu.rules import PackagePin, Refusal
from deployer.modules import boot_loader, disk_space, module_signing
from deployer.modules.package import STAMP_COMMAND, update_command
from deployer.rollout import boot_kernel, free_space
from deployer.rollout.hostops import output_tail

RULE = "package-unavailable"
HEADERS_WHAT = "a kernel's headers, which DKMS builds the driver's module against: "
UNFINISHED_RULE = "dpkg-unfinished"
# The apt source the nvidia_driver role writes (roles/nvidia_driver/tasks/main.yml, its
# apt_repository task's name; tests/unit/test_rollout_availability.py holds the two together).
NVIDIA_SOURCE = "nvidia-cuda"
_SOURCES_DIR = "/etc/apt/sources.list.d"
_DPKG_STATUS = "/var/lib/dpkg/status"
SOURCE_MARK = "gpumon-nvidia-source:"
PLAN_COMMENT = "# the plan installs: "
AUDIT_MARK = "@@ dpkg --audit"
POLICY_MARK = "@@ apt-cache policy"
POLICY_TIMEOUT_S = 120
UPDATE_TIMEOUT_S = 900
LOCK_TIMEOUT_S = 120

Run = Callable[[str, str, float], CommandResult]  # (host, command, timeout) -> result


@dataclass(frozen=True)
class Offer:
    """What ``apt-cache policy`` says of one package: the installed version, the candidate, and
    each version of its version table with whether a source other than dpkg's status file (a
    repository) offers it."""

    installed: str | None
    candidate: str | None
    versions: dict[str, bool] = field(default_factory=dict)

    def downloadable(self) -> list[str]:
        return [v for v, from_source in self.versions.items() if from_source]


def policy_script(pins: Iterable[PackagePin], space: Iterable[str] = (), boot: bool = False) -> str:
    """Read-only shell: whether the NVIDIA source is configured, the free space of the paths
    ``space`` (``free_space.script``), with ``boot`` the boot loader's default kernel
    (``boot_loader.script``) and whether Secure Boot would reject the module DKMS signs
    (``module_signing.script``), what ``dpkg --audit`` finds (packages dpkg left
    half-installed, which make every apt install fail until finished), then ``apt-cache policy``
    of the pins' packages, in the C locale. Its first line, a comment, names what the plan
    installs (``name=version``), for whoever reads the command in a log."""
    pins = list(pins)
    names = dict.fromkeys(p.name for p in pins)
    quoted = " ".join(shlex.quote(n) for n in names)
    src = f"{_SOURCES_DIR}/{NVIDIA_SOURCE}"
    return (
        f"{PLAN_COMMENT}{' '.join(p.apt for p in pins)}\n"
        f"if [ -e {src}.sources ] || [ -e {src}.list ]; then echo '{SOURCE_MARK} yes'; "
        f"else echo '{SOURCE_MARK} no'; fi\n"
        f"{free_space.script(space)}"
        f"{boot_loader.script() + module_signing.script() if boot else ''}"
        f"echo '{AUDIT_MARK}'; LC_ALL=C dpkg --audit 2>&1\n"
        f"echo '{POLICY_MARK}'; LC_ALL=C apt-cache policy -- {quoted}\n"
    )


_ROW = re.compile(r"^ (\*\*\*|   ) (\S+) (-?\d+)$")
_SOURCE = re.compile(r"^ {8}(-?\d+) (.+)$")


@dataclass(frozen=True)
class Answer:
    """:func:`policy_script`'s output: whether the NVIDIA source is configured (None: not said,
    so not the script's output), what ``dpkg --audit`` printed, package -> Offer (a package
    no source or dpkg knows is not in it), and path -> its filesystem's free space."""

    configured: bool | None
    audit: tuple[str, ...]
    offers: dict[str, Offer]
    rooms: dict[str, disk_space.Room] = field(default_factory=dict)
    boot: boot_loader.BootLoader | None = None  # None: not asked
    signing: module_signing.Signing | None = None  # None: not asked


def parse_answer(text: str) -> Answer:
    """:func:`policy_script`'s output, section by section."""
    configured: bool | None = None
    audit: list[str] = []
    policy: list[str] = []
    space: list[str] = []
    boot: list[str] | None = None
    signing: list[str] | None = None
    into: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(SOURCE_MARK):
            configured = line[len(SOURCE_MARK) :].strip() == "yes"
        elif line == free_space.MARK:
            into = space
        elif line == boot_loader.MARK:
            into = boot = []
        elif line == module_signing.MARK:
            into = signing = []
        elif line == AUDIT_MARK:
            into = audit
        elif line == POLICY_MARK:
            into = policy
        elif into is not None:
            into.append(line)
    return Answer(
        configured,
        tuple(ln for ln in audit if ln.strip()),
        parse_policy("\n".join(policy)),
        disk_space.parse(space),
        None if boot is None else boot_loader.parse(boot),
        None if signing is None else module_signing.parse(signing),
    )


def parse_policy(text: str) -> dict[str, Offer]:
    """package -> Offer from ``apt-cache policy``'s output."""
    offers: dict[str, Offer] = {}
    name: str | None = None
    installed = candidate = None
    versions: dict[str, bool] = {}
    current: str | None = None

    def close() -> None:
        if name is not None:
            offers[name] = Offer(installed, candidate, dict(versions))

    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            close()
            name, installed, candidate, versions, current = line[:-1], None, None, {}, None
        elif name is None:
            continue
        elif line.startswith("  Installed: "):
            installed = _version(line.split(": ", 1)[1])
        elif line.startswith("  Candidate: "):
            candidate = _version(line.split(": ", 1)[1])
        elif m := _ROW.match(line):
            current = m.group(2)
            versions.setdefault(current, False)
        elif (
            (m := _SOURCE.match(line))
            and current is not None
            and m.group(2).strip() != _DPKG_STATUS
        ):
            versions[current] = True
    close()
    return offers


def _version(said: str) -> str | None:
    said = said.strip()
    return None if said == "(none)" else said


def missing(pins: Iterable[PackagePin], offers: Mapping[str, Offer]) -> list[str]:
    """What of ``pins`` the host cannot have, each as ``name=version`` with what is offered."""
    out = []
    for p in pins:
        o = offers.get(p.name)
        what = HEADERS_WHAT if p.component == HEADERS_COMPONENT else ""
        if o is None or (p.deb_version is None and o.candidate is None and o.installed is None):
            out.append(f"{p.apt} ({what}no source offers {p.name})")
        elif p.deb_version is None:
            continue
        elif p.deb_version != o.installed and not o.versions.get(p.deb_version):
            offered = ", ".join(o.downloadable()) or "none"
            out.append(f"{p.apt} (offered: {offered})")
    return out


@dataclass
class Verdict:
    """The hosts refused (their refusals), and what is worth a note."""

    refusals: list[Refusal] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)


def check(
    wanted: Mapping[str, tuple[PackagePin, ...]],
    run: Run,
    *,
    refresh: bool,
    forks: int = DEFAULT_FORKS,
    space: Mapping[str, Mapping[str, int]] | None = None,
    kernels: Mapping[str, tuple[str | None, str | None]] | None = None,
) -> Verdict:
    """Each host of ``wanted`` (host -> the packages its plan installs; Debian family) asked what
    its sources offer (and what dpkg left half-installed, the free space of the paths of
    ``space``: host -> path -> MiB its install needs there, and for the hosts of ``kernels``,
    host -> its running and newest kernel, which kernel its reboot boots)."""
    space = space or {}
    kernels = kernels or {}

    def one(host: str) -> tuple[str, Refusal | None, str | None]:
        try:
            refusal, note = _judge(
                run, host, wanted[host], refresh, space.get(host) or {}, kernels.get(host)
            )
        except HostUnreachable as exc:
            why = f"what its package sources offer could not be read: {exc}"
            return (
                host,
                Refusal(host, RULE, why, "make the host reachable, or --limit it out"),
                None,
            )
        except _Unread as exc:
            return host, Refusal(host, RULE, str(exc), "see the command's output on the host"), None
        return host, refusal, note

    verdict = Verdict()
    hosts = list(wanted)
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(hosts) or 1))) as pool:
        for host, refusal, note in pool.map(one, hosts):
            if refusal is not None:
                verdict.refusals.append(refusal)
            if note is not None:
                verdict.notes[host] = note
    return verdict


class _Unread(RuntimeError):
    pass


def _judge(
    run: Run,
    host: str,
    pins: tuple[PackagePin, ...],
    refresh: bool,
    needs: Mapping[str, int],
    kernels: tuple[str | None, str | None] | None = None,
) -> tuple[Refusal | None, str | None]:
    """(the host's refusal, a note) from its answers: refreshed once where its lists lack a
    package and ``refresh``."""
    answer = _read(run, host, pins, needs, boot=kernels is not None)
    if answer.audit:
        return _unfinished(host, answer.audit), None
    short = disk_space.shortfalls(needs, answer.rooms)
    if short:
        return free_space.refusal(host, short), None
    boot_note = signing_note = None
    if kernels is not None and answer.boot is not None:
        refusal, boot_note = boot_kernel.judge(host, answer.boot, *kernels)
        if refusal is not None:
            return refusal, None
    if kernels is not None and answer.signing is not None:
        refusal, signing_note = boot_kernel.judge_signing(host, answer.signing)
        if refusal is not None:
            return refusal, None
    refusal, note = _judge_packages(run, host, pins, refresh, answer)
    return refusal, "; ".join(n for n in (boot_note, signing_note, note) if n) or None


def _judge_packages(
    run: Run, host: str, pins: tuple[PackagePin, ...], refresh: bool, answer: Answer
) -> tuple[Refusal | None, str | None]:
    if answer.configured is False:
        return None, (
            f"its NVIDIA repository ({_SOURCES_DIR}/{NVIDIA_SOURCE}.*) is not configured yet: "
            "what it offers is known once the install step configures it"
        )
    lacking = missing(pins, answer.offers)
    if not lacking:
        return None, None
    if not refresh:
        return None, (
            "not in its package lists: " + "; ".join(lacking) + " (check mode reads the lists "
            "as they are: the run refreshes them first, and refuses what they still lack)"
        )
    # as the package module refreshes before an install: the update, then its stamp
    result = run(host, update_command(LOCK_TIMEOUT_S), UPDATE_TIMEOUT_S)
    if result.rc != 0:
        return _refusal(host, lacking, f"apt-get update failed: {output_tail(result)}"), None
    run(host, STAMP_COMMAND, POLICY_TIMEOUT_S)
    lacking = missing(pins, _read(run, host, pins).offers)
    return (_refusal(host, lacking, "after apt-get update") if lacking else None), None


def _read(
    run: Run,
    host: str,
    pins: tuple[PackagePin, ...],
    space: Iterable[str] = (),
    boot: bool = False,
) -> Answer:
    result = run(host, policy_script(pins, space, boot), POLICY_TIMEOUT_S)
    if result.rc != 0:
        raise _Unread(f"apt-cache policy failed (exit {result.rc}): {output_tail(result)}")
    answer = parse_answer(result.stdout)
    if answer.configured is None:  # the script's first echo is missing: not its output
        raise _Unread(f"what its package sources offer could not be read: {output_tail(result)}")
    return answer


def _unfinished(host: str, audit: tuple[str, ...]) -> Refusal:
    """dpkg left packages half-installed (an install interrupted, a maintainer script that
    failed): apt refuses every install until they are finished, so the driver's would fail with
    the host drained."""
    listed = [ln.split()[0] for ln in audit if ln.startswith(" ") and ln.split()]
    what = ", ".join(listed[:10]) + (f" and {len(listed) - 10} more" if len(listed) > 10 else "")
    return Refusal(
        host,
        UNFINISHED_RULE,
        f"dpkg has not finished installing {what or 'some packages'} (dpkg --audit: "
        f"{audit[0].strip()})",
        "finish them on the host (dpkg --configure -a) or remove them, then run again; nothing "
        "was drained, silenced or stopped",
    )


def _refusal(host: str, lacking: list[str], when: str) -> Refusal:
    advice = "sync the mirror nvidia_repo_url points at, or give --to a version it offers"
    if any(HEADERS_WHAT in text for text in lacking):
        advice += (
            "; for the kernel's headers: offer them in its sources, or install them (or set "
            f"{HEADERS_VAR}: false where the site builds the module another way)"
        )
    return Refusal(
        host,
        RULE,
        "its package sources do not offer " + "; ".join(lacking) + f" ({when})",
        advice + "; nothing was drained, silenced or stopped",
    )
