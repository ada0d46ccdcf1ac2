"""The lab's SSH keys: the controller's client key of a lab or light fleet, and every host's host
key. All ed25519, made with ssh-keygen, the private half owner-only."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class KeygenError(RuntimeError):
    """ssh-keygen failed; the message names the key file and says why."""


def ensure_ed25519(path: Path, comment: str) -> str:
    """The public line (``ssh-ed25519 AAAA... comment``) of the key pair at ``path``; a new pair
    is made unless both halves exist (a half left alone is removed first)."""
    pub = path.with_suffix(".pub")
    if not path.is_file() or not pub.is_file():
        path.unlink(missing_ok=True)
        pub.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise KeygenError(f"ssh-keygen for {path}: {proc.stderr.strip()}")
    os.chmod(path, 0o600)
    return pub.read_text().strip()


def key_type_and_body(public_line: str) -> str:
    """``type body`` of a public key line, without its comment (as known_hosts lists it)."""
    kind, body, *_ = public_line.split()
    return f"{kind} {body}"
