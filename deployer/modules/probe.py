"""A file's state as the file modules read it (``FileProbe``), and many of them read at once.

Alone, a probe is a read script like any other: whether the path exists, then ``stat`` (type,
owner, group, mode), ``sha256sum`` of a regular file's content and ``readlink`` of a link, two
processes per path. In a batch of reads (deployer/hostsession.py) every probe of the batch is
answered by one ``stat`` and one ``sha256sum`` for all their paths (``batch_script``), run before
the batch's other reads, and each probe's output is rebuilt on the controller
(``split_answers``) exactly as the probe prints it alone: a no-op of the node_exporter role read
its nine paths with two processes instead of fifteen (bench/README.md).

A ``FileProbe`` is the ``str`` of its stand-alone script, and so is a ``SectionedRead`` (a read of
``@name`` sections, some of them probes: a repository's keyring and source, a unit's files beside
``systemctl show``), so everything that keeps, compares or sends read scripts handles them
unchanged; anything that builds a new string from one gets a plain read script, batched as before.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from deployer.connection import CommandResult

STAT_FORMAT = "type=%F\\nowner=%U\\ngroup=%G\\nmode=%a\\nlink=%N\\n"
_FIELDS = ("type=", "owner=", "group=", "mode=", "link=")


def _alone(path: str, with_hash: bool) -> str:
    p = shlex.quote(path)
    hash_part = (
        # No subshell, no cut: sha256sum's "HASH  -" goes straight out (one process per file).
        f"if [ -f {p} ]; then printf 'sha256='; sha256sum < {p} || echo; fi; " if with_hash else ""
    )
    return (
        f"if [ -e {p} ] || [ -L {p} ]; then echo exists=1; "
        f"stat --printf '{STAT_FORMAT}' -- {p}; {hash_part}"
        f"if [ -L {p} ]; then printf 'target=%s\\n' \"$(readlink -- {p})\"; fi; "
        "else echo exists=0; fi"
    )


class FileProbe(str):
    """The read of ``path``'s state (with its content's sha256 when ``with_hash``); the string is
    the script that reads it alone."""

    path: str
    with_hash: bool

    def __new__(cls, path: str, with_hash: bool) -> FileProbe:
        probe = super().__new__(cls, _alone(path, with_hash))
        probe.path = path
        probe.with_hash = with_hash
        return probe


def probe_or_script(path: str, with_hash: bool) -> str:
    """The read of ``path``: a ``FileProbe``, or the same script as plain text where the path
    would not read back unambiguously from a shared ``sha256sum`` (a backslash or a newline in
    it: sha256sum escapes those names)."""
    if "\\" in path or "\n" in path:
        return _alone(path, with_hash)
    return FileProbe(path, with_hash)


class SectionedRead(str):
    """A read of named sections, each printed after its ``@name`` line (``readout.sections``
    parses them, in any order); the string is the script that reads them all alone."""

    sections: tuple[tuple[str, str], ...]

    def __new__(cls, sections: Sequence[tuple[str, str]]) -> SectionedRead:
        read = super().__new__(
            cls, "\n".join(f"echo @{name}\n{script}" for name, script in sections)
        )
        read.sections = tuple(sections)
        return read


def _probes_of(script: str) -> list[FileProbe]:
    if isinstance(script, FileProbe):
        return [script]
    if isinstance(script, SectionedRead):
        return [s for _, s in script.sections if isinstance(s, FileProbe)]
    return []


def batched(scripts: Sequence[str]) -> list[FileProbe]:
    """The probes of ``scripts`` a batch answers together (none for fewer than two: alone, a
    probe costs the same processes)."""
    probes = [p for s in scripts for p in _probes_of(s)]
    return probes if len(probes) > 1 else []


def left_to_run(script: str) -> str | None:
    """What of ``script`` a batch whose probes are answered together still runs as its own read:
    a probe nothing, a sectioned read its sections that are not probes (None: none)."""
    if isinstance(script, FileProbe):
        return None
    if isinstance(script, SectionedRead):
        rest = [(n, s) for n, s in script.sections if not isinstance(s, FileProbe)]
        return "\n".join(f"echo @{n}\n{s}" for n, s in rest) if rest else None
    return script


def answer(
    script: str, ran: CommandResult | None, answers: dict[FileProbe, CommandResult] | None
) -> CommandResult | None:
    """``script``'s result in a batch whose probes were answered together: what it ran itself
    (``ran``: None when it ran nothing, or when its part of the output is missing) with its
    probes' answers (None: the batch stopped before them). A sectioned read's probe sections
    follow its other sections' output; its status is theirs unless a probe is its last section
    (a probe alone ends with status 0)."""
    if isinstance(script, FileProbe):
        return None if answers is None else answers[script]
    if not isinstance(script, SectionedRead):
        return ran
    own = left_to_run(script)
    if answers is None or (own is not None and ran is None):
        return None
    stdout = ran.stdout if ran is not None else ""
    if stdout and not stdout.endswith("\n"):
        stdout += "\n"
    for name, part in script.sections:
        if isinstance(part, FileProbe):
            stdout += f"@{name}\n{answers[part].stdout}"
    last_is_probe = isinstance(script.sections[-1][1], FileProbe)
    rc = 0 if last_is_probe or ran is None else ran.rc
    return CommandResult(str(script), rc, stdout, "")


def batch_script(probes: Sequence[FileProbe], token: str) -> str:
    """Shell that prints the state of every probe's path: a ``stat`` of them all, which regular
    files ``[ -f ]`` finds (as a probe alone tests it) and their hashes from one ``sha256sum``, each
    link's target; ends with the line ``@@<token> probes <status>@@``. Read-only, and it leaves the
    shell as it found it (its positional parameters are a function's own; the function is unset)."""
    paths = list(dict.fromkeys(p.path for p in probes))
    hashed = list(dict.fromkeys(p.path for p in probes if p.with_hash))
    quoted = " ".join(shlex.quote(p) for p in paths)
    lines = [
        f"{{ stat --printf '@@{token} s %n\\n{STAT_FORMAT}' -- {quoted}",
        # [ -f ] follows links, as the probe alone does: a link's target file is hashed
        'gpumon_probe_hash() { for gpumon_p do shift; if [ -f "$gpumon_p" ]; then '
        f'printf \'@@{token} f %s\\n\' "$gpumon_p"; set -- "$@" "$gpumon_p"; fi; done; '
        f"printf '@@{token} h\\n'; if [ $# -gt 0 ]; then sha256sum -- \"$@\"; fi; }}",
    ]
    if hashed:
        lines.append(f"gpumon_probe_hash {' '.join(shlex.quote(p) for p in hashed)}")
    lines += [
        "unset -f gpumon_probe_hash",
        f'for gpumon_p in {quoted}; do if [ -L "$gpumon_p" ]; then '
        f"printf '@@{token} l %s\\n' \"$gpumon_p\"; "
        'printf \'target=%s\\n\' "$(readlink -- "$gpumon_p")"; fi; done',
        f"}} 2>/dev/null; printf '\\n@@{token} probes %d@@\\n' $?",
    ]
    return "\n".join(lines)


def split_answers(
    stdout: str, probes: Sequence[FileProbe], token: str
) -> tuple[dict[FileProbe, CommandResult] | None, str]:
    """Each probe's output, as it prints alone, from what :func:`batch_script` printed at the
    start of ``stdout``; and the rest of ``stdout``. None when the batch's own end is missing
    (the shell stopped first): the probes are then read again, each alone."""
    marker = f"\n@@{token} probes "
    pos = stdout.find(marker)
    end = stdout.find("@@\n", pos + len(marker)) if pos >= 0 else -1
    if end < 0:
        return None, stdout
    stats: dict[str, list[str]] = {}
    regular: set[str] = set()
    digests: dict[str, str] = {}
    targets: dict[str, str] = {}
    section: list[str] | None = None
    prefix = f"@@{token} "
    in_hashes = False
    link: str | None = None
    for line in stdout[:pos].split("\n"):
        if line.startswith(prefix):
            kind, _, name = line[len(prefix) :].partition(" ")
            section, link = None, None
            if kind == "s":
                section = stats.setdefault(name, [])
            elif kind == "f":
                regular.add(name)
            elif kind == "h":
                in_hashes = True
            elif kind == "l":
                link = name
        elif section is not None and line.startswith(_FIELDS):
            section.append(line)
        elif link is not None and line.startswith("target="):
            targets[link] = line
            link = None
        elif in_hashes and len(line) > 66 and line[64:66] == "  ":
            digests[line[66:]] = line[:64]
    answers = {}
    for probe in probes:
        path = probe.path
        if path not in stats:
            out = "exists=0\n"
        else:
            out = "exists=1\n" + "".join(f"{f}\n" for f in stats[path])
            if probe.with_hash and path in regular:
                digest = digests.get(path)
                out += f"sha256={digest}  -\n" if digest else "sha256=\n"
            if path in targets:
                out += f"{targets[path]}\n"
        answers[probe] = CommandResult(str(probe), 0, out, "")
    return answers, stdout[end + 3 :]
