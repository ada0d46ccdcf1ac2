"""A SIMULATED GPU host without booting one: the built packages unpacked into a directory and
their stand-ins run against it through ``GPUSIM_ROOT``. Used by the unit tests and handy for
trying the stand-ins by hand; the lab itself installs the packages with apt in booted hosts.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from pathlib import Path

from deployer.lab.gpusim.catalog import DKMS_TOOL


def unpack(debs: list[Path], root: Path) -> None:
    """Unpack .deb files into ``root`` in order (``dpkg-deb -x``: files only, no scripts), then
    build the driver's module as the DKMS package's postinst would, for a sandbox host that has
    its running kernel's headers (the simulated DKMS run against ``root``)."""
    root.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    if (root / DKMS_TOOL.lstrip("/")).exists():
        (root / f"lib/modules/{platform.release()}/build/include").mkdir(
            parents=True, exist_ok=True
        )
        done = run(root, [DKMS_TOOL, "autoinstall"])
        if done.returncode != 0:
            raise RuntimeError(f"the simulated DKMS failed in {root}: {done.stdout}{done.stderr}")


def pick(debs: list[Path], *specs: str) -> list[Path]:
    """The .debs named ``<package>_<version>`` (version without epoch), in the order given."""
    by_key = {"_".join(p.name.split("_")[:2]).removesuffix("-1"): p for p in debs}
    by_key.update({"_".join(p.name.split("_")[:2]): p for p in debs})
    missing = [s for s in specs if s not in by_key]
    if missing:
        raise KeyError(f"no such simulated package: {missing}")
    return [by_key[s] for s in specs]


def env_for(root: Path) -> dict[str, str]:
    return {**os.environ, "GPUSIM_ROOT": str(root), "PYTHONDONTWRITEBYTECODE": "1"}


def run(root: Path, argv: list[str], timeout: float = 60, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:  # fmt: skip
    """Run an installed stand-in (``argv[0]`` is its path on the host, e.g. /usr/bin/nvidia-smi)."""
    exe = root / argv[0].lstrip("/")
    return subprocess.run([str(exe), *argv[1:]], capture_output=True, text=True,
                          env={**env_for(root), **(env or {})},
                          timeout=timeout, check=False)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A stand-in daemon started against ``root`` and ended (by its PID) on exit of the block."""

    def __init__(self, root: Path, argv: list[str], port: int, timeout: float = 10) -> None:
        self.root, self.argv, self.port, self.timeout = root, argv, port, timeout
        self.proc: subprocess.Popen | None = None
        self.stderr = ""

    def __enter__(self) -> Daemon:
        exe = self.root / self.argv[0].lstrip("/")
        self.proc = subprocess.Popen([str(exe), *self.argv[1:]], env=env_for(self.root),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"{self.argv[0]} exited {self.proc.returncode}: {out}{err}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.__exit__(None, None, None)
        raise TimeoutError(f"{self.argv[0]} did not listen on {self.port} in {self.timeout}s")

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            if self.proc.stderr:
                self.stderr = self.proc.stderr.read()  # what it logged, once it has ended
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream:
                    stream.close()
