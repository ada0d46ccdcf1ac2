"""``boot_loader``: a read-only check that a GPU host's next boot starts a kernel the driver's
module is built for; it reads and never reports a change.

Debian's dkms builds the driver's module for two kernels only, the running one and the newest
installed one (dkms 3.0.10 ``/usr/lib/dkms/common.postinst``: ``KERNELS="$CURRENT_KERNEL
$NEWEST_KERNEL"``; the driver role installs both kernels' headers, ``gpu_plan``), and the new
driver's packages take the old driver's module away from every kernel. A host whose boot loader
is set to start another installed kernel -- an administrator's pin (``GRUB_DEFAULT`` to an
entry, or ``saved`` with ``grub-set-default``), a one-time ``grub-reboot`` -- comes back from
its next reboot with no NVIDIA module. So the nvidia_driver role asks this before it installs a
driver (a failure there installs nothing), and ``upgrade-driver``'s preflight asks the same
reading, in the round trip that asks the host's package sources, before it drains a host
(deployer/rollout/boot_kernel.py).

What is read is what GRUB itself reads at boot: ``/boot/grub/grub.cfg``'s menu (its
``menuentry`` / ``submenu`` lines, each entry's ``linux`` line naming the kernel image it loads)
and its ``set default="..."`` (``GRUB_DEFAULT`` as ``grub-mkconfig`` last wrote it;
``${saved_entry}`` for ``saved``), and ``/boot/grub/grubenv``'s ``next_entry`` (``grub-reboot``'s
one boot, which wins over any default) and ``saved_entry`` (grub-common 2.06
``/etc/grub.d/00_header``); and the installed kernel images. The entry is picked as GRUB 2.06
picks it (``grub-core/normal/menu.c``: ``get_entry_number`` takes a leading number first, else
the first entry whose title or id equals the part before an unescaped ``>``; none, or a number
past the menu, is entry 0; a submenu goes on with the part after the ``>``, or the same value
when there is none: ``grub_menu_execute_entry``), so an entry by number inside the submenu
(``1>2``) is told too, and a ``GRUB_DEFAULT`` changed in ``/etc/default/grub`` without
``update-grub`` is judged by what GRUB will do, and said. Where no ``grub.cfg`` can be read,
``GRUB_DEFAULT`` from ``/etc/default/grub`` and ``/etc/default/grub.d/*.cfg`` (sourced in a
subshell, as ``grub-mkconfig`` sources them) stands in, its entry's kernel told from Debian's id
``gnulinux-<release>-advanced-<device>`` or title ``..., with Linux <release>``; an entry by
number cannot be told that way and is a note. An entry that loads an installed kernel neither
the running nor the newest is the problem; no GRUB configuration (another boot loader, a
container): nothing is judged. The formats are Debian's ``/etc/grub.d/10_linux`` (grub-common
2.06-13+deb12u2: ``menuentry '<title>' ... $menuentry_id_option
'gnulinux-$version-$type-$boot_device_id' {``, titles ``"%s, with Linux %s"``, ``linux
${rel_dirname}/${basename} root=...``, the version ``basename`` without its ``vmlinuz-``); the
GRUB sources read are Debian's grub2 2.06-13+deb12u2 source package (``apt-get source grub2``;
its patches leave ``get_entry_number`` as upstream's).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from deployer.connection import CommandResult
from deployer.modules.base import (
    ArgError,
    HostSession,
    Observation,
    Param,
    ReadOnlyCheck,
    register,
)

MARK = "@@ boot loader"
GRUB_CFG = "/boot/grub/grub.cfg"
SAVED = "${saved_entry}"  # what 00_header writes into grub.cfg for GRUB_DEFAULT=saved
# The grub.cfg lines the menu is read from: block openers and closers, the linux lines, the
# default (a menuentry's body has no braces of its own; functions are blocks too)
_CFG_LINES = (
    r"^[[:space:]]*(menuentry|submenu|function)[[:space:]]|^[[:space:]]*\}|"
    r"^[[:space:]]*(linux|linuxefi)[[:space:]]|^[[:space:]]*set default="
)
# gnulinux-<release>-<type>-<boot device id>; the id is empty where grub-probe found none
_ID = re.compile(r"^gnulinux-(?P<release>.+?)-(?:advanced|recovery|init-[A-Za-z0-9_]+)(?:-.*)?$")
_TITLE = re.compile(r", with Linux (?P<release>\S+?)(?: \(.*\))?$")
# A kernel release as uname -r prints it (checked: the module's arguments come from facts)
RELEASE = re.compile(r"^[A-Za-z0-9._+~-]*$")
# How to mend it, said by the role's check and the rollout's refusal alike
FIX = (
    "set the boot loader's default to the running or newest kernel (grub-set-default, or "
    "GRUB_DEFAULT and update-grub), or boot the host into that kernel first"
)


@dataclass(frozen=True)
class MenuEntry:
    """One entry of ``grub.cfg``'s menu: a ``menuentry`` (``release``: the kernel its ``linux``
    line loads, None when it loads none) or a ``submenu`` (``children``)."""

    title: str
    id: str = ""
    release: str | None = None
    children: tuple[MenuEntry, ...] | None = None


@dataclass(frozen=True)
class BootLoader:
    """What the script read: ``None`` fields when the host has no GRUB configuration."""

    default: str | None = None  # GRUB_DEFAULT of /etc/default/grub ("" when left unset)
    saved_entry: str | None = None
    next_entry: str | None = None
    images: tuple[str, ...] = field(default_factory=tuple)  # releases of /boot/vmlinuz-*
    menu: tuple[MenuEntry, ...] | None = None  # grub.cfg's menu (None: no grub.cfg read)
    cfg_default: str | None = None  # grub.cfg's `set default="..."` (None: it sets none)

    @property
    def configured(self) -> bool:
        return self.default is not None or self.menu is not None

    @property
    def entry(self) -> str | None:
        """The entry the next boot starts, as GRUB's ``default`` names it (None: no GRUB)."""
        if not self.configured:
            return None
        if self.next_entry:  # grub-reboot's one boot, whatever the default says
            return self.next_entry
        if self.menu is not None:  # an unset or empty default is entry 0, as is "0"
            if self.cfg_default == SAVED:
                return self.saved_entry or "0"
            return self.cfg_default or "0"
        if (self.default or "").strip() == "saved":
            return self.saved_entry or "0"
        return (self.default or "").strip() or "0"

    def how(self) -> str:
        """How :attr:`entry` is set, for a message."""
        entry = self.entry
        if self.next_entry:
            return f"next_entry {entry!r}, set by grub-reboot for one boot"
        if self.menu is None:
            if (self.default or "").strip() == "saved":
                return f"GRUB_DEFAULT=saved, saved_entry {entry!r}"
            return f"GRUB_DEFAULT={entry!r}"
        if self.cfg_default == SAVED:
            said = f"GRUB_DEFAULT=saved, saved_entry {entry!r}"
        else:
            said = f"default {entry!r} in {GRUB_CFG}"
        wanted = (self.default or "").strip()
        written = "saved" if self.cfg_default == SAVED else (self.cfg_default or "")
        if self.default is not None and (wanted or "0") != (written or "0"):
            said += (
                f"; /etc/default/grub's GRUB_DEFAULT={wanted!r} is not in {GRUB_CFG} until "
                "update-grub runs"
            )
        return said

    def pick(self) -> MenuEntry | None:
        """The menu entry GRUB boots (None: no grub.cfg read, or an empty menu)."""
        if self.menu is None:
            return None
        return pick(self.menu, self.entry or "")


def script(root: str = "") -> str:
    """Read-only shell (after :data:`MARK`): ``default=`` when the host has
    ``/etc/default/grub``; with it or a ``grub.cfg``, ``saved_entry=`` / ``next_entry=`` of the
    environment block, and ``cfg=`` then ``cfg=<line>`` per menu line of ``grub.cfg`` when it can
    be read; ``image=`` per installed kernel image. ``root`` prefixes every path (tests)."""
    r = shlex.quote(root) if root else ""
    return (
        f"echo '{MARK}'\n"
        f"if [ -e {r}/etc/default/grub ]; then "
        f"( GRUB_DEFAULT=; [ -r {r}/etc/default/grub ] && . {r}/etc/default/grub; "
        f'for f in {r}/etc/default/grub.d/*.cfg; do [ -r "$f" ] && . "$f"; done; '
        "printf 'default=%s\\n' \"$GRUB_DEFAULT\" ) </dev/null 2>/dev/null; fi; "
        f"if [ -e {r}/etc/default/grub ] || [ -e {r}{GRUB_CFG} ]; then "
        f"[ -r {r}/boot/grub/grubenv ] && "
        f"grep -E '^(saved_entry|next_entry)=' {r}/boot/grub/grubenv; "
        f"[ -r {r}{GRUB_CFG} ] && echo 'cfg=' && "
        f"grep -E '{_CFG_LINES}' {r}{GRUB_CFG} | sed 's/^/cfg=/'; fi; "
        f'for v in {r}/boot/vmlinuz-*; do [ -e "$v" ] && echo "image=${{v##*/vmlinuz-}}"; done; '
        "true\n"
    )


def parse(lines: Iterable[str]) -> BootLoader:
    default = saved = following = None
    images = []
    cfg: list[str] | None = None
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "default":
            default = value
        elif key == "saved_entry":
            saved = value
        elif key == "next_entry":
            following = value
        elif key == "image" and value:
            images.append(value)
        elif key == "cfg":
            if cfg is None:
                cfg = []
            elif value.strip():
                cfg.append(value)
    menu, cfg_default = (None, None) if cfg is None else parse_menu(cfg)
    return BootLoader(default, saved, following, tuple(images), menu, cfg_default)


_OPENER = re.compile(r"^\s*(menuentry|submenu|function)\s")
_LINUX = re.compile(r"^\s*(?:linux|linuxefi)\s+(\S+)")
_SET_DEFAULT = re.compile(r"^\s*set default=(?P<v>\"[^\"]*\"|'[^']*'|\S*)\s*$")


def parse_menu(lines: Iterable[str]) -> tuple[tuple[MenuEntry, ...], str | None]:
    """grub.cfg's menu and its top-level ``set default`` (the last; GRUB runs them in order)
    from the lines the script kept. A line that cannot be read as an entry (quotes unclosed)
    makes a block of no entry, so the braces still pair."""
    top: list[Any] = []
    stack: list[tuple[str, dict[str, Any] | None]] = []  # (kind, entry being built)
    default = None
    for line in lines:
        opener = _OPENER.match(line)
        if opener:
            entry = None
            if opener.group(1) != "function":
                entry = _entry(line, submenu=opener.group(1) == "submenu")
            if entry is not None:
                (_children(stack) if stack else top).append(entry)
            stack.append((opener.group(1), entry))
        elif line.strip() == "}" or line.strip().startswith("} "):
            if stack:
                stack.pop()
        elif (m := _LINUX.match(line)) and stack and stack[-1][1] is not None:
            built = stack[-1][1]
            if built.get("release") is None and built.get("children") is None:
                built["release"] = kernel_of(m.group(1))
        elif (m := _SET_DEFAULT.match(line)) and not stack:
            default = m.group("v").strip("\"'")
    return tuple(_frozen(e) for e in top), default


def _children(stack: list[tuple[str, dict[str, Any] | None]]) -> list[Any]:
    """Where an entry opened now belongs: the innermost open submenu's children (an entry in
    a menuentry's or a function's body is no menu entry: a throwaway list)."""
    kind, built = stack[-1]
    if kind == "submenu" and built is not None:
        return built["children"]
    return []


def _entry(line: str, submenu: bool) -> dict[str, Any] | None:
    try:
        words = shlex.split(line.rstrip().removesuffix("{"))
    except ValueError:
        return None
    if len(words) < 2:
        return None
    ident = ""
    for flag in ("$menuentry_id_option", "--id"):
        if flag in words[2:-1]:
            ident = words[words.index(flag, 2) + 1]
    # an entry without an id is known by its title (grub-core/commands/menuentry.c: ``menu_id =
    # grub_strdup (id ? : menu_title)``)
    return {"title": words[1], "id": ident or words[1], "release": None,
            "children": [] if submenu else None}  # fmt: skip


def _frozen(built: dict[str, Any]) -> MenuEntry:
    children = built["children"]
    return MenuEntry(
        built["title"],
        built["id"],
        built["release"],
        None if children is None else tuple(_frozen(c) for c in children),
    )


def kernel_of(path: str) -> str:
    """The kernel release a ``linux`` line's image names, as 10_linux derives ``version``
    from the image's ``basename``: ``sed -e "s,^[^0-9]*-,,g"`` (``.efi.signed`` of a signed
    image dropped)."""
    base = path.rsplit("/", 1)[-1].removesuffix(".efi.signed")
    return re.sub(r"^[^0-9]*-", "", base, count=1)


def _number(spec: str) -> int | None:
    """The leading number of ``spec`` as ``grub_strtoul(val, 0, 0)`` reads it (white space
    skipped; ``0x`` hex, a leading ``0`` octal), None where it has none."""
    m = re.match(r"\s*(0x[0-9a-fA-F]+|0[0-7]+|[0-9]+)", spec)
    if m is None:
        return None
    text = m.group(1)
    return int(text, 8) if len(text) > 1 and text[1] != "x" else int(text, 0)


def _split(spec: str) -> tuple[str, str | None]:
    """``spec`` at its first unescaped ``>``: the name before it (``>>`` read as a ``>`` of the
    name, as menu.c's ``menuentry_eq`` reads it) and the part after it (None: no ``>``, or
    nothing after it, where ``grub_menu_execute_entry`` keeps the value)."""
    head, i = [], 0
    while i < len(spec):
        if spec[i] == ">":
            if spec[i + 1 : i + 2] != ">":
                return "".join(head), spec[i + 1 :] or None
            i += 1
        head.append(spec[i])
        i += 1
    return "".join(head), None


def pick(menu: tuple[MenuEntry, ...], spec: str) -> MenuEntry | None:
    """The entry GRUB 2.06 boots of ``menu`` for ``default`` = ``spec`` (see the module
    docstring); None for an empty menu."""
    if not menu:
        return None
    name, rest = _split(spec)
    index = _number(spec)
    if index is None:
        index = next((i for i, e in enumerate(menu) if name in (e.title, e.id)), -1)
    chosen = menu[index if 0 <= index < len(menu) else 0]
    if chosen.children is not None:
        return pick(chosen.children, spec if rest is None else rest)
    return chosen


def release_of(entry: str) -> str | None:
    """The kernel release an entry names (its last ``>`` part: Debian's id or title), else
    None."""
    last = entry.replace(">>", "\0").split(">")[-1].replace("\0", ">")
    for pattern in (_ID, _TITLE):
        m = pattern.search(last)
        if m:
            return m.group("release")
    return None


def first_entry(entry: str) -> bool:
    """The first menu entry: the newest kernel GRUB lists (10_linux's version-sorted list)."""
    return entry == "0" or entry.startswith("gnulinux-simple-")


@dataclass(frozen=True)
class NextBoot:
    """The kernel the host's next boot starts as its boot loader says: ``release`` None where
    that cannot be told (no GRUB configuration, an empty menu, an entry that loads no Linux
    kernel, an entry by number without grub.cfg: then ``note`` says why, where worth saying);
    ``how`` says where it is set, for a message."""

    release: str | None
    how: str = ""
    note: str | None = None


def next_boot(boot: BootLoader, running: str | None, newest: str | None) -> NextBoot:
    """Which kernel GRUB starts next (see the module docstring); an entry of Debian's first
    kind without grub.cfg is the newest kernel (10_linux lists it first)."""
    entry = boot.entry
    if entry is None:
        return NextBoot(None)
    how = boot.how()
    if boot.menu is not None:
        chosen = boot.pick()
        if chosen is None:  # an empty menu: GRUB boots nothing of ours to judge
            return NextBoot(None, how)
        if chosen.release is None:
            return NextBoot(None, how, (
                f"its reboot starts {chosen.title!r} ({how}), which loads no Linux kernel "
                f"{GRUB_CFG} shows: which kernel it boots cannot be told"
            ))  # fmt: skip
        if chosen.id not in entry and chosen.title not in entry:  # by number, or not found
            how = f"{how}: {chosen.title!r}"
        return NextBoot(chosen.release, how)
    if first_entry(entry):
        return NextBoot(newest or running or None, how)
    release = release_of(entry)
    if release is None:
        return NextBoot(None, how, (
            f"which kernel its reboot boots cannot be told ({how}; no {GRUB_CFG} read): "
            f"DKMS builds the driver's module for the running kernel {running or '?'} and "
            f"the newest installed one{f' ({newest})' if newest else ''} only"
        ))  # fmt: skip
    return NextBoot(release, how)


def judge(
    boot: BootLoader, running: str | None, newest: str | None
) -> tuple[str | None, str | None]:
    """(the problem, a note) of a boot loader that starts a kernel DKMS builds no module for:
    the problem as ``boots kernel R (how it is set), which DKMS builds no NVIDIA module for (it
    builds for ...)``, for the caller to put after its subject."""
    nxt = next_boot(boot, running, newest)
    release = nxt.release
    if release is None:
        return None, nxt.note
    if release in (running, newest) or release not in boot.images:
        return None, None
    built = " and ".join(dict.fromkeys(k for k in (running, newest) if k))
    return (
        f"boots kernel {release} ({nxt.how}), which DKMS builds no NVIDIA module for "
        f"(it builds for {built})",
        None,
    )


@register
class BootLoaderCheck(ReadOnlyCheck):
    """The host's next boot starts ``running`` or ``newest`` (the kernels DKMS builds the
    driver's module for) or the first entry; the task fails, saying which kernel and where it is
    set, when the boot loader starts another installed kernel."""

    name = "boot_loader"
    params = {
        "running": Param(str, required=True),
        "newest": Param(str, default=""),
        "purpose": Param(str, default="the driver's install"),
    }

    def check(self, args: dict[str, Any]) -> None:
        for key in ("running", "newest"):
            if not RELEASE.match(args[key]):
                raise ArgError(key, f"{args[key]!r} is not a kernel release")
        if not args["running"]:
            raise ArgError("running", "the running kernel's release is needed")

    def read_script(self, args: dict[str, Any]) -> str:
        return script()

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        lines = result.stdout.splitlines()
        problem, note = judge(parse(lines), args["running"], args["newest"] or None)
        return {"problem": problem or "", "note": note or ""}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"problem": ""}  # (None would be a key not asked)

    def explain(self, args: dict[str, Any], session: HostSession, obs: Observation) -> str:
        return (
            f"the host's reboot {obs.actual['problem']}: after {args['purpose']} it would come "
            f"back without its driver; {FIX}; nothing was installed"
        )
