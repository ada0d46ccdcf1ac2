"""The lab's offline artifact mirror: what an air-gapped site's local mirror would hold.

Built once into ``<cache>/mirror/site`` and served over HTTP on the lab bridge:

- ``debian/``: a signed flat apt repository with the packages of ``mirror-packages.yml`` and
  their dependency closure, downloaded with the machine's apt (``apt_mirror_url``);
- ``releases/``: upstream-layout release archives (``<project>-<ver>.linux-amd64.tar.gz`` and
  ``sha256sums.txt``; VictoriaMetrics' own ``<name>-linux-amd64-v<ver>.tar.gz`` and
  ``_checksums.txt``) repacked from those Debian binaries (``release_mirror_url``);
- ``cuda/debian12/x86_64/``: a signed repository in the CUDA repository's layout holding the
  *simulated* NVIDIA packages of ``deployer.lab.gpusim`` (``nvidia_repo_url``);
- ``keys/gpumon-lab-archive-key.asc``: the public half of the key the lab generated to sign both.

The signing key lives in ``<cache>/mirror/gnupg`` (0700) and never leaves it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

import yaml

from deployer.lab import localserver, procs
from deployer.lab.base import cache_lock
from deployer.lab.paths import cache_root

PACKAGES_FILE = Path(__file__).with_name("mirror-packages.yml")
KEY_NAME = "gpumon-lab-archive-key.asc"
CUDA_PATH = "cuda/debian12/x86_64"
KEY_UID = "gpumon lab mirror (lab only, signs simulated packages) <lab-mirror@gpumon.invalid>"
SERVE_WAIT_S = 10.0
# Fixed mtime for repacked archives, so rebuilding them gives the same bytes and checksums.
ARCHIVE_MTIME = 1_700_000_000


class MirrorError(RuntimeError):
    """Building or serving the mirror failed."""


@dataclass(frozen=True)
class MirrorUrls:
    """The mirror's URLs as hosts see them (inventory mirror vars)."""

    base: str

    @property
    def apt(self) -> str:
        return f"{self.base}/debian"

    @property
    def nvidia_repo(self) -> str:
        return f"{self.base}/{CUDA_PATH}/"

    @property
    def key(self) -> str:
        return f"{self.base}/keys/{KEY_NAME}"

    @property
    def releases(self) -> str:
        return f"{self.base}/releases"

    def apt_sources(self) -> str:
        """deb822 sources for a host: the lab mirror only, verified with the lab's key."""
        return (
            "# gpumon lab: the offline mirror on the lab bridge replaces Debian's sources\n"
            "Types: deb\n"
            f"URIs: {self.apt}/\n"
            "Suites: ./\n"
            "Signed-By: /etc/apt/keyrings/gpumon-lab-mirror.asc\n"
        )


def mirror_dir() -> Path:
    return cache_root() / "mirror"


def site_dir() -> Path:
    return mirror_dir() / "site"


def load_package_list(path: Path = PACKAGES_FILE) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("debian"), list):
        raise MirrorError(f"{path}: expected a 'debian' list of package names")
    return data


# ---------------------------------------------------------------- signing key


def gnupg_home() -> Path:
    home = mirror_dir() / "gnupg"
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    return home


def _gpg(*args: str, input_data: bytes | None = None) -> bytes:
    cmd = [
        "gpg",
        "--homedir",
        str(gnupg_home()),
        "--batch",
        "--yes",
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
        *args,
    ]
    proc = subprocess.run(cmd, input=input_data, capture_output=True, check=False)
    if proc.returncode != 0:
        raise MirrorError(f"gpg {args[0]} failed: {proc.stderr.decode(errors='replace')[-800:]}")
    return proc.stdout


def _stop_gpg_agent() -> None:
    """gpg starts an agent per home directory; end it so nothing of ours keeps running."""
    subprocess.run(
        ["gpgconf", "--homedir", str(gnupg_home()), "--kill", "all"],
        capture_output=True,
        check=False,
    )


def signing_fingerprint() -> str:
    """Fingerprint of the lab's archive key, generated on first use."""
    listing = _gpg("--with-colons", "--list-secret-keys").decode()
    fprs = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    if fprs:
        return fprs[0]
    _gpg("--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
    listing = _gpg("--with-colons", "--list-secret-keys").decode()
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def public_key() -> bytes:
    """The armored public archive key (what hosts put in /etc/apt/keyrings)."""
    try:
        return _gpg("--armor", "--export", signing_fingerprint())
    finally:
        _stop_gpg_agent()  # listing secret keys starts an agent; leave nothing running


# ---------------------------------------------------------------- apt repositories


def write_flat_repo(repo: Path, label: str) -> None:
    """Index and sign a flat apt repository (Packages, Packages.gz, Release, InRelease)."""
    scan = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
        cwd=repo,
        capture_output=True,
        check=False,
    )
    if scan.returncode != 0:
        raise MirrorError(f"dpkg-scanpackages in {repo}: {scan.stderr.decode()[-800:]}")
    (repo / "Packages").write_bytes(scan.stdout)
    (repo / "Packages.gz").write_bytes(gzip.compress(scan.stdout, mtime=0))
    (repo / "Release").write_text(release_file(repo, label, ["Packages", "Packages.gz"]))
    fpr = signing_fingerprint()
    for old in ("InRelease", "Release.gpg"):
        (repo / old).unlink(missing_ok=True)
    _gpg(
        "--local-user",
        fpr,
        "--clearsign",
        "--output",
        str(repo / "InRelease"),
        str(repo / "Release"),
    )
    _gpg(
        "--local-user",
        fpr,
        "--armor",
        "--detach-sign",
        "--output",
        str(repo / "Release.gpg"),
        str(repo / "Release"),
    )


def release_file(repo: Path, label: str, names: list[str]) -> str:
    lines = [
        "Origin: gpumon-lab",
        f"Label: {label}",
        "Architectures: amd64 all",
        f"Date: {formatdate(usegmt=True)}",
    ]
    for field, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(f"{field}:")
        for name in names:
            data = (repo / name).read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data)} {name}")
    return "\n".join(lines) + "\n"


def dependency_closure(packages: list[str]) -> list[str]:
    """The packages and everything they depend on (real packages only, no virtual names)."""
    proc = subprocess.run(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            *packages,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise MirrorError(f"apt-cache depends: {proc.stderr.strip()[-800:]}")
    names = {
        line.strip()
        for line in proc.stdout.splitlines()
        if line and not line.startswith((" ", "<"))
    }
    return sorted(names)


def download_debs(packages: list[str], pool: Path, log: Path | None = None) -> list[Path]:
    """apt-get download the candidates of ``packages`` into ``pool`` (skipping those present)."""
    pool.mkdir(parents=True, exist_ok=True)
    uris = _print_uris(packages)
    missing = [name for _url, name in uris if not (pool / name).is_file()]
    if missing:
        want = sorted({name.split("_")[0] for name in missing})
        proc = subprocess.run(
            ["apt-get", "download", *want], cwd=pool, capture_output=True, text=True, check=False
        )
        if log is not None:
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise MirrorError(f"apt-get download failed: {proc.stderr.strip()[-800:]}")
    out = []
    for _url, name in uris:
        path = pool / name
        if not path.is_file():
            raise MirrorError(f"apt-get download did not produce {name}")
        out.append(path)
    return out


def _print_uris(packages: list[str]) -> list[tuple[str, str]]:
    proc = subprocess.run(
        ["apt-get", "download", "--print-uris", *packages],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        # Stale package lists are the usual cause; refresh once and retry.
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
        proc = subprocess.run(
            ["apt-get", "download", "--print-uris", *packages],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise MirrorError(f"apt-get download --print-uris: {proc.stderr.strip()[-800:]}")
    out = []
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            out.append((fields[0].strip("'"), fields[1]))
    return out


# ---------------------------------------------------------------- release archives


def upstream_version(deb_version: str) -> str:
    """``2.42.0+ds-5+deb12u1`` -> ``2.42.0`` (epoch, Debian revision and +ds dropped)."""
    version = deb_version.split(":", 1)[-1].rsplit("-", 1)[0]
    return re.split(r"[+~]", version, maxsplit=1)[0]


def deb_field(deb: Path, field: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True, check=True
    ).stdout.strip()


def build_release_archive(project: str, deb: Path, files: dict[str, str], out_root: Path) -> Path:
    """Repack binaries of a Debian package as ``<project>-<ver>.linux-amd64.tar.gz`` in the
    upstream release layout, with a ``sha256sums.txt`` beside it. Returns the archive path."""
    version = upstream_version(deb_field(deb, "Version"))
    stem = f"{project}-{version}.linux-amd64"
    dest = out_root / "prometheus" / project / "releases" / "download" / f"v{version}"
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
            _add_dir(tar, stem)
            for name, rel in sorted(files.items()):
                _add_file(tar, f"{stem}/{name}", Path(tmp) / rel, 0o755)
            copyright_file = Path(tmp) / "usr/share/doc" / deb_field(deb, "Package") / "copyright"
            if copyright_file.is_file():
                _add_file(tar, f"{stem}/LICENSE", copyright_file, 0o644)
            note = (
                f"Repacked by the gpumon lab from Debian package {deb.name} for the lab's "
                "offline release mirror.\n"
            ).encode()
            _add_bytes(tar, f"{stem}/NOTICE", note, 0o644)
    archive = dest / f"{stem}.tar.gz"
    # gzip header mtime is fixed by tarfile's gzip wrapper only via GzipFile; rewrite it.
    archive.write_bytes(_fixed_gzip(buffer.getvalue()))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (dest / "sha256sums.txt").write_text(f"{digest}  {archive.name}\n")
    return archive


def build_victoriametrics_archives(
    deb: Path, archives: dict[str, dict[str, str]], out_root: Path
) -> Path:
    """Repack a Debian victoria-metrics package as VictoriaMetrics' own release archives:
    ``<name>-linux-amd64-v<ver>.tar.gz`` holding ``<binary>-prod`` files at the top, each with a
    ``<name>-linux-amd64-v<ver>_checksums.txt`` listing the archive and its binaries
    (VictoriaMetrics v1.79.5 Makefile, release-victoria-metrics-goos-goarch and
    release-vmutils-goos-goarch). Returns the first archive's path."""
    version = upstream_version(deb_field(deb, "Version"))
    dest = (
        out_root / "VictoriaMetrics" / "VictoriaMetrics" / "releases" / "download" / f"v{version}"
    )
    dest.mkdir(parents=True, exist_ok=True)
    first: Path | None = None
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        for name, files in archives.items():
            stem = f"{name}-linux-amd64-v{version}"
            buffer = io.BytesIO()
            sums = []
            with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
                for member, rel in sorted(files.items()):
                    data = (Path(tmp) / rel).read_bytes()
                    _add_bytes(tar, member, data, 0o755)
                    sums.append(f"{hashlib.sha256(data).hexdigest()}  {member}")
            archive = dest / f"{stem}.tar.gz"
            archive.write_bytes(_fixed_gzip(buffer.getvalue()))
            digest = hashlib.sha256(archive.read_bytes()).hexdigest()
            lines = [f"{digest}  {archive.name}", *sums]
            (dest / f"{stem}_checksums.txt").write_text("\n".join(lines) + "\n")
            first = first or archive
    if first is None:
        raise MirrorError(f"no archive to build from {deb.name}")
    return first


def _fixed_gzip(data: bytes) -> bytes:
    return gzip.compress(gzip.decompress(data), mtime=ARCHIVE_MTIME)


def _tarinfo(name: str, mode: int, kind: bytes = tarfile.REGTYPE, size: int = 0):
    info = tarfile.TarInfo(name)
    info.mode, info.type, info.size = mode, kind, size
    info.mtime, info.uid, info.gid, info.uname, info.gname = ARCHIVE_MTIME, 0, 0, "root", "root"
    return info


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    tar.addfile(_tarinfo(name, 0o755, tarfile.DIRTYPE))


def _add_file(tar: tarfile.TarFile, name: str, src: Path, mode: int) -> None:
    _add_bytes(tar, name, src.read_bytes(), mode)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    tar.addfile(_tarinfo(name, mode, size=len(data)), io.BytesIO(data))


# ---------------------------------------------------------------- the whole mirror


def _gpusim() -> Any:
    try:
        from deployer.lab import gpusim
    except ImportError:
        return None
    return gpusim if hasattr(gpusim, "build_packages") else None


def gpusim_digest(box_kernels: tuple[str, ...] = ()) -> str | None:
    """A digest of the GPU simulation's sources and the kernels its headers' stand-ins are of
    (a change rebuilds the CUDA-layout repo)."""
    root = Path(__file__).with_name("gpusim")
    if not root.is_dir():
        return None
    from deployer.lab.gpusim.catalog import lab_kernel

    digest = hashlib.sha256()
    digest.update(lab_kernel().encode())  # the kernel headers' stand-in is of this kernel
    for release in sorted(box_kernels):  # and of these (a Vagrant box's)
        digest.update(b"\0" + release.encode())
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_mirror(log: Path | None = None, box_kernels: tuple[str, ...] = ()) -> dict[str, Any]:
    """Build whatever part of the mirror is missing or out of date. Returns its manifest.
    ``box_kernels``: the kernels of the lab's Vagrant box, whose headers' stand-in the
    simulated repository carries from then on (added to those of earlier calls, kept in the
    manifest, so a lab that names none does not rebuild it without them)."""
    with cache_lock("mirror"):
        try:
            return _ensure_mirror(log, box_kernels)
        finally:
            _stop_gpg_agent()


def kept_box_kernels(manifest: dict[str, Any], asked: tuple[str, ...]) -> tuple[str, ...]:
    """The box kernels the simulated repository carries headers of: those it carried (the
    manifest's) and those asked now, sorted: a lab naming none keeps what a Vagrant cluster
    added, so the two do not rebuild it in turn."""
    return tuple(sorted({*(manifest.get("box_kernels") or []), *asked}))


def _ensure_mirror(log: Path | None, box_kernels: tuple[str, ...] = ()) -> dict[str, Any]:
    site = site_dir()
    site.mkdir(parents=True, exist_ok=True)
    manifest_path = mirror_dir() / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (FileNotFoundError, ValueError):
        manifest = {}
    spec = load_package_list()
    key = public_key()
    keys = site / "keys"
    keys.mkdir(exist_ok=True)
    (keys / KEY_NAME).write_bytes(key)

    sim = _gpusim()
    kernels = kept_box_kernels(manifest, box_kernels)
    sim_key = gpusim_digest(kernels) if sim is not None else None
    if sim is not None and manifest.get("cuda_key") != sim_key:
        repo = site / CUDA_PATH
        staging = mirror_dir() / "cuda-staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        built = sim.build_packages(staging, kernels)
        if not built:
            raise MirrorError("gpusim.build_packages() built no package")
        write_flat_repo(staging, "gpumon-lab simulated CUDA repository (simulation)")
        (staging / KEY_NAME).write_bytes(key)
        shutil.rmtree(repo, ignore_errors=True)
        repo.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(repo)
        manifest["cuda_key"] = sim_key
        manifest["box_kernels"] = list(kernels)
        manifest["cuda_packages"] = sorted(p.name for p in built)
        manifest.pop("debian_key", None)  # their dependencies join the Debian closure
    elif sim is None:
        manifest["cuda_key"] = None
        manifest["cuda_packages"] = []

    wanted = list(spec["debian"]) + _sim_dependencies(site / CUDA_PATH)
    # The release archives are rebuilt with the Debian part, so their spec is part of its key.
    key_data = {"debian": sorted(set(wanted)), "releases": spec.get("releases", {})}
    debian_key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:16]
    if manifest.get("debian_key") != debian_key or not (site / "debian/InRelease").is_file():
        names = dependency_closure(sorted(set(wanted)))
        debs = download_debs(names, mirror_dir() / "pool", log)
        repo = site / "debian"
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir(parents=True)
        for deb in debs:
            os.link(deb, repo / deb.name)
        write_flat_repo(repo, "gpumon-lab Debian mirror")
        releases = site / "releases"
        shutil.rmtree(releases, ignore_errors=True)
        by_package = {deb_field(d, "Package"): d for d in debs}
        archives = {}
        for project, entry in spec.get("releases", {}).items():
            deb = by_package[entry["package"]]
            if entry.get("layout") == "victoriametrics":
                archive = build_victoriametrics_archives(deb, entry["archives"], releases)
            else:
                archive = build_release_archive(project, deb, entry["files"], releases)
            archives[project] = str(archive.relative_to(site))
        manifest.update(debian_key=debian_key, debian_packages=len(debs), releases=archives)
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return manifest


def _sim_dependencies(repo: Path) -> list[str]:
    """Debian packages the simulated NVIDIA packages depend on (names only)."""
    packages = repo / "Packages"
    if not packages.is_file():
        return []
    ours = set()
    deps: set[str] = set()
    for stanza in packages.read_text().split("\n\n"):
        fields = dict(
            (line.split(":", 1)[0], line.split(":", 1)[1].strip())
            for line in stanza.splitlines()
            if ":" in line and not line.startswith(" ")
        )
        if "Package" in fields:
            ours.add(fields["Package"])
        for field in ("Depends", "Pre-Depends"):
            for alt in fields.get(field, "").split(","):
                name = alt.split("|")[0].strip().split(" ")[0].split(":")[0]
                if name:
                    deps.add(name)
    return sorted(deps - ours)


# ---------------------------------------------------------------- serving


def serve(address: str, port: int, pid_file: Path, log: Path) -> procs.Tracked:
    """Start (or keep) the mirror's HTTP server on ``address:port``; PID recorded."""
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", address]
    argv += ["--directory", str(site_dir())]
    server = localserver.serve(
        argv, pid_file, log, lambda: _answers(address, port), wait_s=SERVE_WAIT_S
    )
    if server is None:
        raise MirrorError(f"the mirror's HTTP server did not answer on {address}:{port}; see {log}")
    return server


def stop_serving(pid_file: Path) -> None:
    localserver.stop(pid_file)


def _answers(address: str, port: int) -> bool:
    return localserver.answers(address, port, f"keys/{KEY_NAME}")
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/keys/{KEY_NAME}", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def release_versions() -> dict[str, str]:
    """``{"<project>_version": "<version>"}`` for the release archives the built mirror holds."""
    manifest_path = mirror_dir() / "manifest.json"
    try:
        releases = json.loads(manifest_path.read_text()).get("releases", {})
    except (OSError, ValueError):
        return {}
    out = {}
    for project, rel in releases.items():
        match = re.search(r"/download/v([^/]+)/", rel)
        if match:
            out[f"{project}_version"] = match.group(1)
    return out


# Debian's alertmanager binary (repacked into the lab's release archive) is built to read its
# notification templates from this Debian path, where upstream's binary embeds them. The lab puts
# the Debian package's templates on every host so the repacked binary runs as upstream's would.
DEBIAN_ONLY_FILES = {"prometheus-alertmanager": "usr/share/prometheus/alertmanager"}


def ensure_host_files() -> Path:
    """A tree of files every lab host gets (see DEBIAN_ONLY_FILES), extracted once from the pool."""
    out = mirror_dir() / "host-files"
    stamp = out / ".done"
    if stamp.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for package, subdir in DEBIAN_ONLY_FILES.items():
        debs = sorted((mirror_dir() / "pool").glob(f"{package}_*.deb"))
        if not debs:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["dpkg-deb", "-x", str(debs[-1]), tmp], check=True)
            source = Path(tmp) / subdir
            if source.is_dir():
                shutil.copytree(source, out / subdir, dirs_exist_ok=True)
    stamp.write_text("")
    return out
