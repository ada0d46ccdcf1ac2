"""The controller's TLS directory is the one the tier was deployed with.

The tier's CA, password and rotation record live only in the controller's ``gpumon_tls_dir``.
A controller without them (a new machine, a lost or mistyped directory, another user's default
directory) would create a new CA and password at its first look and push them: every server
presents a certificate of a CA its clients do not trust, and checks a password they do not send,
until the last host of the tier has converged; a blind spot of every target for as long as the
run takes, where a rotation (deployer/tls/rotation.py) leaves none.

So, before anything is touched: a host whose facts show that it already trusts a CA of the tier
(``/etc/gpumon/tls/ca.pem``, deployer/facts.py) refuses the run when its TLS directory held none
of the tier's credentials when this run first looked at it (``material.held_credentials``),
unless what the host trusts is exactly what it would get (your own CA, ``gpumon_tls_ca_cert``,
with your own ``gpumon_basic_auth_password``, and, where the inventory has a long-term store
whose credential the tier makes, your own ``metrics_store_password``: a new one would have the
store refuse the replicas' writes, and Prometheus drops a batch answered 401, until the last
replica had it), or ``gpumon_tls_start_over`` says to replace the CA and password on purpose.
The caller (deployer/session.py ``tls_refusals``) reads, read-only, the facts of every other
host of a directory that held none, so that a run limited to a new host is judged on the CA the
rest of the tier trusts. What the run created in such a directory is
removed by the caller (``material.discard_created``), so that the next run is refused again
rather than taking the new CA for the tier's.

The file stays on a host when TLS is switched off, so a tier whose TLS was switched off and is
switched on again from an empty directory is refused too: ``gpumon_tls_start_over`` says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.booleans import truthy
from deployer.tls import material
from deployer.tls.rotation import normal_pem

START_OVER = "gpumon_tls_start_over"
# The roles' default metrics_store_group (roles/prometheus and roles/victoriametrics defaults).
STORE_GROUP = "metrics_store"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)


@dataclass(frozen=True)
class Unknown:
    """A host trusting a CA that its controller directory does not hold."""

    host: str
    directory: Path
    trusted: tuple[str, ...]  # the host's CAs, as "subject (SHA-256 fingerprint)"
    # only the long-term store's password would be new (your own CA and password, unchanged)
    store_only: bool = False

    @property
    def message(self) -> str:
        harm = (
            "the run would make and push a new password of the long-term store, and the store "
            "would refuse the replicas' writes (Prometheus drops what is answered 401) until "
            "every replica had it; set your own metrics_store_password, the one the store has"
            if self.store_only
            else "the run would push a new CA and password, and every scrape of the tier would "
            "fail until its last host had them"
        )
        return (
            f"it trusts the tier's CA {', '.join(self.trusted) or '(unreadable)'} "
            f"({material.HOST_CA_FILE}, written while gpumon_tls was on), but gpumon_tls_dir "
            f"{self.directory} held no CA, password or rotation record when this run began (a "
            f"new controller, a lost or mistyped directory): {harm}"
        )

    @property
    def fix(self) -> str:
        return (
            f"restore {self.directory} from your backup, or point gpumon_tls_dir at the "
            f"directory the tier was deployed with; to replace the tier's CA and password on "
            f"purpose (or to switch TLS on again afresh after it was off), run once with "
            f"-e {START_OVER}=true (scrapes fail while the hosts converge)"
        )


def described(bundle: str) -> tuple[str, ...]:
    """Each certificate of a PEM bundle as "subject (SHA-256 fingerprint)"; one that does not
    parse as "unparsable certificate"."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    out = []
    for block in _PEM.findall(bundle):
        try:
            cert = x509.load_pem_x509_certificate(block.encode())
        except ValueError:
            out.append("unparsable certificate")
            continue
        digest = cert.fingerprint(hashes.SHA256()).hex(":").upper()
        out.append(f"{cert.subject.rfc4514_string()} (SHA-256 {digest})")
    return tuple(out)


def _store_password_made(variables: Mapping[str, Any], has_store: bool) -> bool:
    """Whether the run would make the long-term store's password (the roles' default under
    gpumon_tls) for an inventory that has a store: not when you give it, nor when you set the
    store's user name to nothing (no auth). ``variables``: the host's, without role defaults."""
    if not has_store or variables.get("metrics_store_username", None) == "":
        return False
    given = variables.get("metrics_store_password")
    return not given or "gpumon_tls_material" in str(given)


def _own_and_unchanged(variables: Mapping[str, Any], host_ca: str) -> bool:
    """The user's own CA and password: what the host trusts is what it would get again."""
    given = variables.get("gpumon_tls_ca_cert")
    if not given or not variables.get("gpumon_basic_auth_password"):
        return False
    host = str(variables.get("inventory_hostname", "?"))
    pem = material.pem_or_path(given, host, "gpumon_tls_ca_cert", False)
    return normal_pem(pem) == normal_pem(host_ca)


def unknown_cas(
    hosts: Mapping[str, tuple[Mapping[str, Any], str | None]],
    has_store: Callable[[str], bool] = lambda _: False,
) -> list[Unknown]:
    """``host -> (its variables, the CA bundle its facts read, None: none)``: the hosts that
    trust a CA of the tier their controller directory does not hold (see the module).
    ``has_store(group)``: whether the inventory has a host in that group (the host's
    ``metrics_store_group``, the long-term store's)."""
    out = []
    for host, (variables, host_ca) in hosts.items():
        if (
            host_ca is None
            or not material.enabled(variables)
            or truthy(variables.get(START_OVER, False))
        ):
            continue
        d = material.tls_dir(variables)
        if material.held_credentials(d):
            continue
        own = _own_and_unchanged(variables, host_ca)
        group = str(variables.get("metrics_store_group") or STORE_GROUP)
        store = own and _store_password_made(variables, has_store(group))
        if own and not store:
            continue
        out.append(Unknown(host, d, described(host_ca), store_only=store))
    return out
