"""What one host gets when the inventory switches ``gpumon_tls`` on: its certificate and key, the
CA, the basic-auth user and password (the clients') and its bcrypt hash (the servers'), and the
exporter-toolkit web config that every server of the tier reads.

Variables (any inventory layer; the same for every host of one cluster):

- ``gpumon_tls``: the switch (off by default: nothing changes for an inventory that does not set it).
- ``gpumon_tls_dir``: the controller directory of the cluster's CA, the hosts' certificates and
  the password (default ``<gpumon secrets dir>/tls/<gpumon_tls_cluster>``, ``gpumon_tls_cluster``
  defaulting to ``default``: give each cluster its own).
- ``gpumon_tls_cert_days`` (397) and ``gpumon_tls_renew_days`` (30): a host certificate is issued
  again by ``up`` once it expires within the threshold.
- ``gpumon_tls_names``: more names (DNS or addresses) for the host's certificate; the host's
  inventory name, its ``ansible_host``, ``localhost``, 127.0.0.1 and ::1 are always there.
- Your own certificates instead: ``gpumon_tls_ca_cert`` (PEM or a controller path) and, per host,
  ``gpumon_tls_cert`` and ``gpumon_tls_private_key`` (PEM or a path; the key is a secret).
- ``gpumon_basic_auth_username`` (``gpumon``) and ``gpumon_basic_auth_password`` (default: one
  generated and kept 0600 in ``gpumon_tls_dir``/basic-auth-password).
- ``gpumon_tls_start_over``: replace the CA and password that hosts trust with those of an
  empty ``gpumon_tls_dir`` on purpose (otherwise refused: deployer/tls/continuity.py).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deployer.booleans import truthy
from deployer.controller_secrets import controller_secret, default_dir, read_private, write_private
from deployer.errors import InputError
from deployer.secrets import register_secret
from deployer.tls import rotation

# The X.509 stack (deployer.tls.ca, cryptography.x509) is imported by the functions that issue or
# read certificates, when an inventory switches gpumon_tls on: a tenth of every run's start-up
# otherwise (bench/README.md, "Start-up").

# Host paths every role shares: the CA clients verify with, and curl's client config (the CA and
# the user:password) for the roles' own on-host probes (wait_for, readiness of HA peers, reloads).
HOST_TLS_DIR = "/etc/gpumon/tls"
HOST_CA_FILE = f"{HOST_TLS_DIR}/ca.pem"
HOST_CURLRC = f"{HOST_TLS_DIR}/curlrc"
# TLS 1.2 at least: exporter-toolkit's own default (web/tls_config.go, MinVersion tls.VersionTLS12).
MIN_VERSION = "TLS12"

_LOCK = threading.Lock()
_CACHE: dict[tuple[Any, ...], dict[str, Any]] = {}
# What each TLS directory held when this process first looked at it (the product's files in it,
# relative; None: no directory), before anything of this process wrote there: whether it held the
# tier's credentials then (deployer/tls/continuity.py), and what to remove when a run that
# created them is refused.
_SIGHTS: dict[str, frozenset[str] | None] = {}
_SIGHTS_LOCK = threading.Lock()  # not _LOCK: host_tls holds that one while it computes
# Files whose presence says the directory holds a tier's credentials: the product's CA, the
# rotation record, or the password of a version that kept no record.
CREDENTIAL_FILES = ("ca.crt", "rotation.json", "basic-auth-password")
# Everything the product writes in a TLS directory: these names at its top (the CA and its key,
# the passwords, the rotation record, the hash of a version before the record) and the files of
# its own subdirectories (hosts' keys and certificates; the certificates hosts served, of your CA).
PRODUCT_FILES = (
    "ca.crt",
    "ca.key",
    "basic-auth-password",
    "rotation.json",
    "metrics-store-password",
    "basic-auth-password.bcrypt",
)
PRODUCT_DIRS = ("hosts", "served")

OFF: dict[str, Any] = {
    "enabled": False,
    "scheme": "http",
    "curl_opts": "",
    "ca_file": HOST_CA_FILE,
    "curlrc": HOST_CURLRC,
}


def enabled(variables: Mapping[str, Any]) -> bool:
    return truthy(variables.get("gpumon_tls", False))


def scheme(variables: Mapping[str, Any]) -> str:
    return "https" if enabled(variables) else "http"


# The variables that say whether a host has TLS material and from which directory.
DIRECTORY_VARS = ("gpumon_tls", "gpumon_tls_dir", "gpumon_tls_cluster")


def tls_dir(variables: Mapping[str, Any]) -> Path:
    given = variables.get("gpumon_tls_dir")
    if given:
        return Path(str(given)).expanduser()
    cluster = str(variables.get("gpumon_tls_cluster") or "default")
    return Path(default_dir()) / "tls" / cluster


def _files(d: Path) -> frozenset[str] | None:
    """The product's files in ``d`` (relative paths; None: no directory): its own names at the
    top and what its own subdirectories hold. Nothing else of the directory is listed, nor ever
    removed: a ``gpumon_tls_dir`` mistyped as a busy directory stays as others left it."""
    if not d.is_dir():
        return None
    out = {name for name in PRODUCT_FILES if (d / name).exists() or (d / name).is_symlink()}
    for sub in PRODUCT_DIRS:
        if (d / sub).is_dir() and not (d / sub).is_symlink():
            out.add(sub)
            out.update(f"{sub}/{p.name}" for p in (d / sub).iterdir())
    return frozenset(out)


def first_sight(d: Path) -> frozenset[str] | None:
    """The product's files ``d`` held when this process first looked at it (None: it did not
    exist); a directory not looked at yet is looked at now."""
    key = str(d)
    with _SIGHTS_LOCK:
        if key not in _SIGHTS:
            _SIGHTS[key] = _files(d)
        return _SIGHTS[key]


def held_credentials(d: Path) -> bool:
    """Whether ``d`` held a tier's credentials (CREDENTIAL_FILES) before this process wrote."""
    seen = first_sight(d)
    return seen is not None and any(name in seen for name in CREDENTIAL_FILES)


def discard_created(d: Path) -> list[str]:
    """Remove the product's files this process created in ``d`` since its first sight (and the
    directory, when it did not exist then and holds nothing else now), and forget what was
    computed from them; the paths removed, relative."""
    seen = first_sight(d) or frozenset()
    now = _files(d) or frozenset()
    created = sorted(now - seen, key=lambda r: (-r.count("/"), r))  # a directory's files first
    for rel in created:
        p = d / rel
        if p.is_dir() and not p.is_symlink():
            if not any(p.iterdir()):
                p.rmdir()
        else:
            p.unlink(missing_ok=True)
    if first_sight(d) is None and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
    forget()
    return created


def _int(variables: Mapping[str, Any], key: str, default: int, host: str) -> int:
    value = variables.get(key, default)
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InputError(f"host {host}: {key} must be a whole number of days, got {value!r}",
                         key=key) from None  # fmt: skip
    if n < 0:
        raise InputError(f"host {host}: {key} must not be negative", key=key)
    return n


def pem_or_path(value: Any, host: str, key: str, secret: bool) -> str:
    """A PEM given inline, or the content of the controller file it names."""
    text = str(value).strip()
    if text.startswith("-----BEGIN"):
        return text + "\n"
    path = Path(text).expanduser()
    if not path.is_absolute():
        raise InputError(f"host {host}: {key} is neither a PEM block nor an absolute path", key=key)
    try:
        data = read_private(path) if secret else path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"host {host}: {key}: {path} does not exist", key=key) from None
    except OSError as exc:
        raise InputError(
            f"host {host}: {key}: cannot read {path}: {exc.strerror}", key=key
        ) from None
    out = data.decode("utf-8", "replace")
    if "-----BEGIN" not in out:
        raise InputError(f"host {host}: {key}: {path} holds no PEM block", key=key)
    return out


def host_names(variables: Mapping[str, Any]) -> list[str]:
    host = str(variables.get("inventory_hostname", ""))
    names = [host, str(variables.get("ansible_host") or host), "localhost", "127.0.0.1", "::1"]
    extra = variables.get("gpumon_tls_names") or []
    if isinstance(extra, str):
        extra = [extra]
    names += [str(n) for n in extra]
    return names


def _password(variables: Mapping[str, Any], directory: Path) -> str:
    given = variables.get("gpumon_basic_auth_password")
    if given:
        value = str(given)
        register_secret(value)
        return value
    return controller_secret(directory / "basic-auth-password")


def _desired_ca(variables: Mapping[str, Any], host: str, d: Path) -> str:
    if variables.get("gpumon_tls_ca_cert"):
        return pem_or_path(variables["gpumon_tls_ca_cert"], host, "gpumon_tls_ca_cert", False)
    from deployer.tls import ca as ca_mod

    return ca_mod.ensure_ca(d).cert_pem


def rotation_view(variables: Mapping[str, Any], *, create: bool = True) -> rotation.View:
    """The step of the credential's and CA's rotation (deployer/tls/rotation.py) for what the
    inventory asks now. ``create=False`` (a read-only command): a directory that holds no
    rotation record is an error naming it, and nothing is written there."""
    host = str(variables.get("inventory_hostname", "?"))
    d = tls_dir(variables)
    first_sight(d)  # before anything below writes there
    if not create and not (d / rotation.RECORD).exists():
        raise InputError(
            f"host {host}: gpumon_tls is on but gpumon_tls_dir {d} holds no credential of the "
            "tier (no rotation.json): this controller has not run `up` with it. Point "
            "gpumon_tls_dir at the directory `up` used (or restore it from your backup)",
            key="gpumon_tls_dir",
        )
    base = str(variables.get("gpumon_basic_auth_username") or "gpumon")
    if ":" in base:
        raise InputError(
            f"host {host}: gpumon_basic_auth_username must not contain ':'",
            key="gpumon_basic_auth_username",
        )
    return rotation.view(d, base, _password(variables, d), _desired_ca(variables, host, d))


def client(variables: Mapping[str, Any], *, create: bool = True) -> dict[str, Any] | None:
    """What a client of the tier needs on the controller (the CA bundle clients trust now, the
    user and password clients send now), or None when the switch is off. ``create=False``: see
    :func:`rotation_view`."""
    if not enabled(variables):
        return None
    v = rotation_view(variables, create=create)
    return {"ca_pem": v.ca_bundle, "username": v.client.username, "password": v.client.password}


def forget() -> None:
    """Drop what this process computed (after a rotation moved a step: the next pass renders the
    next step)."""
    with _LOCK:
        _CACHE.clear()
    rotation.forget()


def host_tls(variables: Mapping[str, Any]) -> dict[str, Any]:
    """The template global ``gpumon_tls_material()``: ``OFF`` when the switch is off, else this host's
    material (see the module's docstring), computed once per process and host."""
    if not enabled(variables):
        return OFF
    host = str(variables.get("inventory_hostname", "?"))
    d = tls_dir(variables)
    days = _int(variables, "gpumon_tls_cert_days", 397, host)
    renew = _int(variables, "gpumon_tls_renew_days", 30, host)
    names = host_names(variables)
    own = variables.get("gpumon_tls_ca_cert")
    key = (str(d), host, tuple(names), days, renew, bool(own))
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        out = _compute(variables, host, d, names, days, renew)
        _CACHE[key] = out
        return out


def _own(variables: Mapping[str, Any], host: str, d: Path, v: rotation.View) -> tuple[str, str]:
    """The user's certificate and key for ``host``: the ones given, except while a change of CA
    is only widened, when the host keeps presenting the one it had (recorded 0600 in
    ``served/<host>.pem`` on the controller, beside the product's own host keys)."""
    missing = [k for k in ("gpumon_tls_cert", "gpumon_tls_private_key") if not variables.get(k)]
    if missing:
        raise InputError(
            f"host {host}: gpumon_tls_ca_cert is set, so {' and '.join(missing)} must be too "
            "(your own certificates), or unset gpumon_tls_ca_cert for the product's CA",
            key=missing[0],
        )
    cert_pem = pem_or_path(variables["gpumon_tls_cert"], host, "gpumon_tls_cert", False)
    key_pem = pem_or_path(variables["gpumon_tls_private_key"], host, "gpumon_tls_private_key", True)
    if "PRIVATE KEY" not in key_pem:
        raise InputError(
            f"host {host}: gpumon_tls_private_key holds no private key",
            key="gpumon_tls_private_key",
        )
    register_secret(key_pem)
    served = d / "served" / f"{host}.pem"
    given_ca = rotation.normal_pem(
        pem_or_path(variables["gpumon_tls_ca_cert"], host, "gpumon_tls_ca_cert", False)
    )
    if v.serving_ca != given_ca and served.exists():
        kept = read_private(served).decode()
        register_secret(kept)
        cut = kept.index("-----BEGIN CERTIFICATE")
        return kept[cut:], kept[:cut]
    record = (key_pem + cert_pem).encode()
    if not served.exists() or read_private(served) != record:
        write_private(served, record, 0o600)
    return cert_pem, key_pem


def _compute(
    variables: Mapping[str, Any], host: str, d: Path, names: list[str], days: int, renew: int
) -> dict[str, Any]:
    v = rotation_view(variables)
    if variables.get("gpumon_tls_ca_cert"):
        cert_pem, key_pem = _own(variables, host, d, v)
    else:
        from cryptography import x509

        from deployer.tls import ca as ca_mod

        authority = ca_mod.ensure_ca(d)
        # While a new CA is only widened (clients trust both), a host keeps its certificate of
        # the old one; it presents one of the new CA from the switch on.
        keep = None
        if v.retiring_ca is not None and v.serving_ca != rotation.normal_pem(authority.cert_pem):
            keep = x509.load_pem_x509_certificate(v.serving_ca.encode())
        issued = ca_mod.issue_host(
            authority, d, host, names, days=days, renew_days=renew, also_signed_by=keep
        )
        cert_pem, key_pem = issued.cert_pem, issued.key_pem
    register_secret(key_pem)
    cred = v.client
    curlrc = (
        "# Managed by gpumon-deploy: curl's client config for the tier's TLS and basic auth\n"
        f'cacert = "{HOST_CA_FILE}"\n'
        f'user = "{cred.username}:{cred.password}"\n'
    )
    settled = v.step in (rotation.SETTLED, "narrow")
    other = "client-password" + rotation.SECOND_SUFFIX if cred.slot == 1 else "client-password"
    return {
        "enabled": True,
        "scheme": "https",
        "curl_opts": f"-K {HOST_CURLRC}",
        "ca_file": HOST_CA_FILE,
        "curlrc": HOST_CURLRC,
        "ca_pem": v.ca_bundle,
        "cert_pem": cert_pem,
        "key_pem": key_pem,
        "username": cred.username,
        "password": cred.password,
        # The clients' password file of the credential they send (its slot's name: a rotation
        # changes the user name and the file in one reload), and the other slot's, removed once
        # no client reads it ("" while a rotation is under way).
        "client_password_file": cred.password_file,
        "stale_client_password_file": other if settled else "",
        "basic_auth_users": dict(v.accepted),
        "rotation_step": v.step,
        # The long-term store's own credential (roles victoriametrics and prometheus default
        # metrics_store_password to it under gpumon_tls): VictoriaMetrics 1.79 takes one user.
        "store_password": controller_secret(d / "metrics-store-password"),
        "curlrc_content": curlrc,
    }


def web_config(material: Mapping[str, Any], directory: str) -> dict[str, Any]:
    """The exporter-toolkit web config of a server whose key and certificate are in
    ``directory``/server.pem, one file so that a renewal replaces both at once (format: web/tls_config.go ``Config``, prometheus/exporter-toolkit v0.8.2
    5b1eab3 lines 38-54: tls_server_config cert_file/key_file/min_version, basic_auth_users)."""
    return {
        "tls_server_config": {
            "cert_file": f"{directory}/server.pem",
            "key_file": f"{directory}/server.pem",
            "min_version": MIN_VERSION,
        },
        "basic_auth_users": dict(material["basic_auth_users"]),
    }
