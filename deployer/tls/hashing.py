"""The bcrypt hash of the basic-auth password that the web configs carry (exporter-toolkit
compares with golang.org/x/crypto/bcrypt, ``$2a$``/``$2b$``/``$2y$`` hashes: web/handler.go
``bcrypt.CompareHashAndPassword``, prometheus/exporter-toolkit v0.8.2 5b1eab3 line 128).

A new salt each run would rewrite every web config each ``up``: the hash is kept on the controller
(0600, next to the password) and used again for as long as it verifies the password; a changed
password gets a new hash once.
"""

from __future__ import annotations

from pathlib import Path

import bcrypt

from deployer.controller_secrets import read_private, write_private

# Go's bcrypt.DefaultCost; each request to a server with basic auth pays one comparison.
COST = 10


def verifies(password: str, hashed: str) -> bool:
    try:
        return bcrypt.checkpw(password.encode(), hashed.encode())
    except ValueError:
        return False


def new_hash(password: str) -> str:
    if not password:
        raise ValueError("an empty password has no hash")
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(COST)).decode()


def password_hash(password: str, record: Path) -> str:
    """The hash of ``password`` kept in ``record``: the one there when it verifies, else a new one
    (written 0600)."""
    if not password:
        raise ValueError("an empty password has no hash")
    if record.exists():
        kept = read_private(record).decode().strip()
        if verifies(password, kept):
            return kept
    hashed = new_hash(password)
    write_private(record, (hashed + "\n").encode(), 0o600)
    return hashed
