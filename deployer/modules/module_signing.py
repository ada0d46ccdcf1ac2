"""``module_signing``: a read-only check that a GPU host under UEFI Secure Boot will load the
driver module DKMS builds for it; it reads and never reports a change.

Under Secure Boot a Debian kernel loads only modules signed by a key it trusts (the firmware's
``db`` or shim's MOK list; docs/unverified.md#secure-boot-module-signature). NVIDIA's packages
build the module with DKMS, which signs it with its own certificate: dkms 3.0.10-8+deb12u1
``prepare_signing`` (``/usr/sbin/dkms``) takes ``mok_signing_key`` / ``mok_certificate`` from
``/etc/dkms/framework.conf`` and ``framework.conf.d/*.conf``, else ``/var/lib/dkms/mok.key`` /
``mok.pub``, and generates a new self-signed pair when they are missing -- a key nothing has
enrolled. A host whose DKMS certificate is not enrolled installs the new driver, has the old
module taken away, and comes back from its reboot without a driver the kernel will load. So
the nvidia_driver role asks this before it installs a driver, and ``upgrade-driver``'s preflight
asks the same reading, in the round trip that asks the host's package sources, before it drains
a host (deployer/rollout/boot_kernel.py).

Read: the ``SecureBoot`` and ``SetupMode`` EFI variables (efivarfs, ``/sys/firmware/efi/
efivars``: four attribute bytes, then the value), and whether shim's ``MokSBStateRT`` exists
(validation disabled in shim), as mokutil 0.6.0's ``sb_state`` reads them: enforced when
``SecureBoot`` is 1, ``SetupMode`` 0 and no ``MokSBStateRT``; then DKMS's certificate and
``mokutil --test-key`` of it, whose first line says ``<file> is not enrolled`` /
``is already enrolled`` / ``is already in db`` / ``is already in the enrollment request`` /
``is blocked in dbx`` (mokutil 0.6.0 ``src/mokutil.c``, ``test_key`` and
``print_skip_message``, lcp/mokutil b4d8693; its exit status changed in later releases, so the
text is what is read). No EFI variables (a BIOS boot, a container): nothing is judged; mokutil
not installed: a note.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
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

MARK = "@@ module signing"
EFIVARS = "/sys/firmware/efi/efivars"
GLOBAL = "8be4df61-93ca-11d2-aa0d-e98c0e9c2a2c"  # EFI_GLOBAL_VARIABLE
SHIM = "605dab50-e046-4300-abb6-3dd810dd8b23"  # shim's vendor GUID
DEFAULT_CERT = "/var/lib/dkms/mok.pub"


def fix(cert: str) -> str:
    """How to mend it, said by the role's check and the rollout's refusal alike."""
    return (
        f"enroll DKMS's certificate (mokutil --import {cert or DEFAULT_CERT}, then confirm the "
        "enrollment on the host's console at its next boot), or have DKMS sign with an enrolled "
        "key (mok_signing_key and mok_certificate in /etc/dkms/framework.conf)"
    )


_TRUSTED = (" is already enrolled", " is already in db")


@dataclass(frozen=True)
class Signing:
    """What the script read. ``enforced``: Secure Boot on, so modules must be signed by a
    trusted key; ``cert``: DKMS's certificate (``""``: none yet, DKMS makes one at the build);
    ``test_key``: mokutil's first line about it (None: not asked, ``""``: no mokutil)."""

    enforced: bool = False
    cert: str = DEFAULT_CERT
    test_key: str | None = None


def script(root: str = "") -> str:
    """Read-only shell (after :data:`MARK`): ``secure_boot=`` / ``setup_mode=`` (the variables'
    value byte, empty when absent), ``shim_validation=off``, ``cert=`` (DKMS's certificate,
    empty when the file is missing) and, with Secure Boot enforced and a certificate,
    ``test_key=`` (mokutil's first line, empty without mokutil). ``root`` prefixes every path
    (tests)."""
    r = shlex.quote(root) if root else ""
    value = 'v() { [ -r "$1" ] && od -An -t u1 -j4 -N1 "$1" | tr -d " \\n"; true; }'
    return (
        f"echo '{MARK}'\n"
        f"{value}; sb=$(v {r}{EFIVARS}/SecureBoot-{GLOBAL}); sm=$(v {r}{EFIVARS}/SetupMode-{GLOBAL}); "
        'printf \'secure_boot=%s\\nsetup_mode=%s\\n\' "$sb" "$sm"; '
        f"[ -e {r}{EFIVARS}/MokSBStateRT-{SHIM} ] && echo shim_validation=off; "
        "cert=$( ( mok_certificate=; "
        f"for f in {r}/etc/dkms/framework.conf {r}/etc/dkms/framework.conf.d/*.conf; do "
        '[ -r "$f" ] && . "$f" >/dev/null 2>&1; done; '
        f'printf %s "${{mok_certificate:-{DEFAULT_CERT}}}" ) </dev/null 2>/dev/null ); '
        f'[ -e {r}"$cert" ] || cert=; printf "cert=%s\\n" "$cert"; '
        f'if [ "$sb" = 1 ] && [ "$sm" = 0 ] && [ ! -e {r}{EFIVARS}/MokSBStateRT-{SHIM} ] '
        '&& [ -n "$cert" ]; then if command -v mokutil >/dev/null 2>&1; then '
        f'printf "test_key=%s\\n" "$(LC_ALL=C mokutil --test-key {r}"$cert" 2>&1 | head -n 1)"; '
        "else echo test_key=; fi; fi; true\n"
    )


def parse(lines: Iterable[str]) -> Signing:
    seen: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            seen[key] = value
    enforced = (
        seen.get("secure_boot") == "1"
        and seen.get("setup_mode") == "0"
        and seen.get("shim_validation") != "off"
    )
    return Signing(enforced, seen.get("cert", DEFAULT_CERT), seen.get("test_key"))


def judge(signing: Signing) -> tuple[str | None, str | None]:
    """(the problem, a note) of a host whose kernel would reject the module DKMS signs: the
    problem as a clause (``runs under Secure Boot and ...``) for the caller to put after its
    subject."""
    if not signing.enforced:
        return None, None
    if not signing.cert:
        return (
            "runs under Secure Boot and DKMS has no signing certificate yet "
            f"({DEFAULT_CERT} or framework.conf's mok_certificate), so the build would make a "
            "new key nobody has enrolled",
            None,
        )
    said = (signing.test_key or "").strip()
    if signing.test_key is None or not said:
        return None, (
            f"it runs under Secure Boot and whether DKMS's certificate {signing.cert} is enrolled "
            "cannot be told without mokutil: if it is not, the kernel rejects the new module"
        )
    if said.endswith(_TRUSTED):
        return None, None
    if said.endswith(" is already in the enrollment request"):
        why = (
            "is waiting in the MOK enrollment request, which shim's MokManager enrolls only "
            "when someone confirms it on the console at boot (an unattended reboot goes on "
            "without it)"
        )
    elif said.endswith(" is not enrolled"):
        why = "is not enrolled (mokutil --test-key)"
    else:
        why = f"is not trusted: mokutil --test-key says {said!r}"
    return (
        f"runs under Secure Boot and DKMS signs the driver's module with {signing.cert}, which "
        f"{why}",
        None,
    )


@register
class ModuleSigning(ReadOnlyCheck):
    """Under Secure Boot, DKMS's signing certificate is one the kernel trusts; the task fails,
    saying which certificate and what mokutil said, when the new module would be rejected."""

    name = "module_signing"
    params = {"purpose": Param(str, default="the driver's install")}

    def check(self, args: dict[str, Any]) -> None:
        if not args["purpose"].strip():
            raise ArgError("purpose", "say what is about to be installed")

    def read_script(self, args: dict[str, Any]) -> str:
        return script()

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        signing = parse(result.stdout.splitlines())
        problem, note = judge(signing)
        return {"problem": problem or "", "cert": signing.cert, "note": note or ""}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"problem": ""}  # (None would be a key not asked)

    def explain(self, args: dict[str, Any], session: HostSession, obs: Observation) -> str:
        return (
            f"the host {obs.actual['problem']}: after {args['purpose']} its kernel would reject "
            "the new module at the reboot, and the host would come back without its driver; "
            f"{fix(obs.actual['cert'])}; nothing was installed"
        )
