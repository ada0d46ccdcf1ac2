"""Building the SIMULATED NVIDIA packages: each :class:`~deployer.lab.gpusim.catalog.Deb` becomes
a .deb through ``dpkg-deb --build``, reproducibly (fixed timestamps, root ownership, sorted
members), with no network.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deployer.lab.gpusim.catalog import HOMEPAGE, MAINTAINER, SIM_LINE, Deb, all_packages

#: Every member of every package carries this time (2025-01-01T00:00:00Z).
SOURCE_DATE_EPOCH = 1735689600


def control_text(deb: Deb, installed_kib: int) -> str:
    fields = [
        ("Package", deb.name),
        ("Version", deb.version),
        ("Architecture", deb.arch),
        ("Maintainer", MAINTAINER),
        ("Installed-Size", str(installed_kib)),
        ("Pre-Depends", ", ".join(deb.pre_depends)),
        ("Depends", ", ".join(deb.depends)),
        ("Recommends", ", ".join(deb.recommends)),
        ("Conflicts", ", ".join(deb.conflicts)),
        ("Replaces", ", ".join(deb.replaces)),
        ("Provides", ", ".join(deb.provides)),
        ("Section", deb.section),
        ("Priority", "optional"),
        ("Homepage", HOMEPAGE),
        ("Description", f"SIMULATED {deb.summary}\n{SIM_LINE}"),
    ]
    return "".join(f"{k}: {v}\n" for k, v in fields if v)


def _write_tree(deb: Deb, root: Path) -> None:
    total = 0
    sums = []
    for rel, (data, mode) in sorted(deb.files.items()):
        target = root / rel.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
        total += len(data)
        sums.append(f"{hashlib.md5(data).hexdigest()}  {rel.lstrip('/')}\n")
    debian = root / "DEBIAN"
    debian.mkdir(parents=True, exist_ok=True)
    debian.chmod(0o755)
    (debian / "control").write_text(control_text(deb, max(1, (total + 1023) // 1024)))
    (debian / "md5sums").write_text("".join(sums))
    if deb.conffiles:
        (debian / "conffiles").write_text("".join(f"{c}\n" for c in deb.conffiles))
    for name, text in sorted(deb.scripts.items()):
        script = debian / name
        script.write_text(text)
        script.chmod(0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames:
            (Path(dirpath) / n).chmod(0o755)
        for n in [*dirnames, *filenames]:
            os.utime(
                Path(dirpath) / n, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False
            )
    os.utime(root, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def build_deb(deb: Deb, outdir: Path, workdir: Path) -> Path:
    """Build one package into ``outdir``; returns the .deb path."""
    root = workdir / f"{deb.name}_{deb.version.replace(':', '_')}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    _write_tree(deb, root)
    out = outdir / deb.filename
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    proc = subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"dpkg-deb failed for {deb.filename}: {proc.stderr.strip()}")
    return out


def build_packages(outdir: Path, box_kernels: tuple[str, ...] = ()) -> list[Path]:
    """Build every SIMULATED NVIDIA package into ``outdir`` (created if missing); returns the
    .deb paths in catalog order. Same source, same bytes. ``box_kernels``: kernels whose
    headers' stand-in the repository also carries (catalog.all_packages)."""
    if shutil.which("dpkg-deb") is None:
        raise RuntimeError(
            "dpkg-deb is required to build the simulated NVIDIA packages (apt-get install dpkg)"
        )
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    debs = all_packages(box_kernels)
    with tempfile.TemporaryDirectory(prefix="gpusim-build-") as tmp:
        work = Path(tmp)
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            return list(pool.map(lambda d: build_deb(d, outdir, work), debs))
