"""A dpkg database of one's own for unit tests: a status file (deb-status(5)) written into an
admin directory, and ``dpkg-query``/``dpkg`` on ``PATH`` that run this machine's real dpkg on it
(``--admindir``). The read scripts then meet what real dpkg prints for a host with foreign
architectures (instances per architecture, their order), without root or installing anything."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

needs_dpkg = pytest.mark.skipif(
    shutil.which("dpkg-query") is None or shutil.which("dpkg") is None, reason="needs dpkg (Debian)"
)

STATUS = {
    "ii": "install ok installed",
    "hi": "hold ok installed",
    "rc": "deinstall ok config-files",
    "iU": "install ok unpacked",
}


@dataclass(frozen=True)
class Instance:
    package: str
    arch: str
    version: str
    status: str = "ii"  # a key of STATUS
    multi_arch: str = "same"  # "" for a package without the field (one instance at most)

    def stanza(self) -> str:
        return (
            f"Package: {self.package}\nStatus: {STATUS[self.status]}\nPriority: optional\n"
            f"Section: libs\nInstalled-Size: 1\nMaintainer: Test <test@example.org>\n"
            f"Architecture: {self.arch}\n"
            + (f"Multi-Arch: {self.multi_arch}\n" if self.multi_arch else "")
            + f"Version: {self.version}\nDescription: test package\n"
        )


def write_db(directory: Path, bindir: Path, native: str, *instances: Instance) -> Path:
    """An admin directory under ``directory`` holding ``instances`` (foreign architectures
    registered as dpkg does), and ``dpkg``/``dpkg-query`` wrappers in ``bindir`` that read it, the
    native architecture being ``native``. The admin directory."""
    admin = directory / "dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    foreign = sorted({i.arch for i in instances} - {native, "all"})
    (admin / "arch").write_text("".join(f"{a}\n" for a in [native, *foreign]))
    (admin / "status").write_text("\n".join(i.stanza() for i in instances))
    bindir.mkdir(parents=True, exist_ok=True)
    query = shutil.which("dpkg-query")
    (bindir / "dpkg-query").write_text(f'#!/bin/sh\nexec {query} --admindir={admin} "$@"\n')
    # dpkg's native architecture is the one it was built for: the wrapper answers for the host
    (bindir / "dpkg").write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --print-architecture ] && {{ echo {native}; exit 0; }}\n'
        f'exec {shutil.which("dpkg")} --admindir={admin} "$@"\n'
    )
    for tool in ("dpkg-query", "dpkg"):
        (bindir / tool).chmod(0o755)
    return admin


def install_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str, *instances: Instance
) -> Path:
    """:func:`write_db` under ``tmp_path``, its wrappers first on ``PATH``."""
    bindir = tmp_path / "bin"
    admin = write_db(tmp_path, bindir, native, *instances)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin")
    return admin
