"""``module_signing``: under UEFI Secure Boot the kernel loads only modules signed by a key it
trusts, and DKMS signs the new NVIDIA module with its own certificate; a host whose certificate
is not enrolled would come back from its reboot without a driver. Read by this machine's shell
from EFI variables and a DKMS configuration written under a temporary root. ``mokutil`` is a
stand-in on PATH printing mokutil 0.6.0's own lines (``src/mokutil.c``: ``test_key``,
``print_skip_message``), since the real one reads the firmware's MOK list, which no machine here
has."""

from __future__ import annotations

import shutil

import pytest

from deployer.connection import CommandResult, LocalConnection
from deployer.gpu.rules import PackagePin
from deployer.modules import module_signing
from deployer.modules.module_signing import ModuleSigning, Signing
from deployer.results import Status
from deployer.rollout import availability
from tests.unit import rooted

EFIVARS = "sys/firmware/efi/efivars"
NOT_ENROLLED = "is not enrolled"


def efivar(root, name: str, guid: str, value: int) -> None:
    """An efivarfs file: four attribute bytes (NV, BS, RT), then the value byte."""
    (root / EFIVARS).mkdir(parents=True, exist_ok=True)
    (root / EFIVARS / f"{name}-{guid}").write_bytes(bytes([7, 0, 0, 0, value]))


def secure_boot(root, on: int = 1, setup_mode: int = 0, cert: str | None = "var/lib/dkms/mok.pub"):
    efivar(root, "SecureBoot", module_signing.GLOBAL, on)
    efivar(root, "SetupMode", module_signing.GLOBAL, setup_mode)
    if cert is not None:
        (root / cert).parent.mkdir(parents=True, exist_ok=True)
        (root / cert).write_bytes(b"0\x82\x03\x0f")  # the start of a DER certificate


@pytest.fixture
def mokutil(tmp_path, monkeypatch):
    """A mokutil on PATH answering --test-key with ``said`` (set through the returned dict) as
    mokutil 0.6.0 prints it, after the file name; its calls logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "mokutil.log"
    says = tmp_path / "mokutil.says"
    (bin_dir / "mokutil").write_text(
        f'#!/bin/sh\necho "$@" >> {log}\nprintf "%s %s\\n" "$2" "$(cat {says})"\n'
    )
    (bin_dir / "mokutil").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    says.write_text(NOT_ENROLLED)

    class Stub:
        def say(self, text: str) -> None:
            says.write_text(text)

        def calls(self) -> list[str]:
            return log.read_text().splitlines() if log.exists() else []

    return Stub()


def read(root) -> Signing:
    result = LocalConnection().run(module_signing.script(str(root)), timeout=30)
    assert result.rc == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == module_signing.MARK
    return module_signing.parse(lines[1:])


def test_a_host_without_efi_variables_is_not_judged_and_mokutil_not_asked(tmp_path, mokutil):
    signing = read(tmp_path)
    assert not signing.enforced and signing.test_key is None
    assert module_signing.judge(signing) == (None, None)
    assert mokutil.calls() == []


@pytest.mark.parametrize(
    ("on", "setup_mode", "shim_off"),
    [(0, 0, False), (1, 1, False), (1, 0, True)],
    ids=["secure-boot-off", "setup-mode", "validation-disabled-in-shim"],
)
def test_secure_boot_not_enforced_is_not_judged(tmp_path, mokutil, on, setup_mode, shim_off):
    secure_boot(tmp_path, on, setup_mode)
    if shim_off:
        efivar(tmp_path, "MokSBStateRT", module_signing.SHIM, 1)
    signing = read(tmp_path)
    assert not signing.enforced
    assert module_signing.judge(signing) == (None, None) and mokutil.calls() == []


@pytest.mark.parametrize("said", ["is already enrolled", "is already in db"])
def test_a_certificate_the_kernel_trusts_is_no_problem(tmp_path, mokutil, said):
    secure_boot(tmp_path)
    mokutil.say(said)
    signing = read(tmp_path)
    assert signing.enforced and signing.cert == "/var/lib/dkms/mok.pub"
    assert signing.test_key == f"{tmp_path}/var/lib/dkms/mok.pub {said}"
    assert module_signing.judge(signing) == (None, None)
    assert mokutil.calls() == [f"--test-key {tmp_path}/var/lib/dkms/mok.pub"]


@pytest.mark.parametrize(
    ("said", "why"),
    [
        (NOT_ENROLLED, "which is not enrolled (mokutil --test-key)"),
        ("is already in the enrollment request", "which is waiting in the MOK enrollment request, "
         "which shim's MokManager enrolls only when someone confirms it on the console at boot"),
        ("is blocked in dbx", "which is not trusted: mokutil --test-key says "),
    ],
)  # fmt: skip
def test_a_certificate_the_kernel_does_not_trust_is_the_problem(tmp_path, mokutil, said, why):
    secure_boot(tmp_path)
    mokutil.say(said)
    problem, note = module_signing.judge(read(tmp_path))
    assert note is None
    assert problem.startswith(
        "runs under Secure Boot and DKMS signs the driver's module with /var/lib/dkms/mok.pub, "
        + why
    )


def test_the_certificate_framework_conf_names_is_the_one_asked(tmp_path, mokutil):
    secure_boot(tmp_path, cert="etc/dkms/site-mok.der")
    (tmp_path / "etc/dkms/framework.conf.d").mkdir(parents=True)
    (tmp_path / "etc/dkms/framework.conf.d/site.conf").write_text(
        'mok_signing_key="/etc/dkms/site-mok.key"\nmok_certificate="/etc/dkms/site-mok.der"\n'
    )
    signing = read(tmp_path)
    assert signing.cert == "/etc/dkms/site-mok.der"
    assert mokutil.calls() == [f"--test-key {tmp_path}/etc/dkms/site-mok.der"]


def test_no_certificate_yet_is_the_problem_dkms_would_make_a_key_nobody_enrolled(tmp_path, mokutil):
    secure_boot(tmp_path, cert=None)
    signing = read(tmp_path)
    assert signing.cert == "" and mokutil.calls() == []
    problem, _ = module_signing.judge(signing)
    assert problem.startswith("runs under Secure Boot and DKMS has no signing certificate yet")


def without_mokutil(tmp_path, monkeypatch) -> None:
    """PATH with the script's tools and no mokutil, and Secure Boot on under ``tmp_path``."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("sh", "od", "tr", "head"):
        (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tools))
    secure_boot(tmp_path)


def test_without_mokutil_whether_it_is_enrolled_cannot_be_told_and_is_a_note(tmp_path, monkeypatch):
    without_mokutil(tmp_path, monkeypatch)
    signing = read(tmp_path)
    assert signing.test_key == ""
    problem, note = module_signing.judge(signing)
    assert problem is None
    assert note.startswith("it runs under Secure Boot and whether DKMS's certificate "
                           "/var/lib/dkms/mok.pub is enrolled cannot be told without mokutil")  # fmt: skip


# ---- through the executor, as the nvidia_driver role runs it ---------------------------------


def converge(root, check: bool = False):
    args = {"purpose": "driver 595.45.04's install"}
    return rooted.converge(
        ModuleSigning(), args, rooted.UnderRoot(str(root), module_signing.script), check
    )


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_the_role_fails_a_host_whose_certificate_is_not_enrolled_before_anything(
    tmp_path, mokutil, check
):
    secure_boot(tmp_path)
    result = converge(tmp_path, check=check)
    assert result.status == Status.FAILED and not result.wrote
    assert result.error == (
        "the host runs under Secure Boot and DKMS signs the driver's module with "
        "/var/lib/dkms/mok.pub, which is not enrolled (mokutil --test-key): after driver "
        "595.45.04's install its kernel would reject the new module at the reboot, and the host "
        "would come back without its driver; enroll DKMS's certificate (mokutil --import "
        "/var/lib/dkms/mok.pub, then confirm the enrollment on the host's console at its next "
        "boot), or have DKMS sign with an enrolled key (mok_signing_key and mok_certificate in "
        "/etc/dkms/framework.conf); nothing was installed"
    )
    mokutil.say("is already enrolled")
    assert converge(tmp_path, check=check).status == Status.OK


def test_without_mokutil_the_role_passes_with_the_note(tmp_path, monkeypatch):
    without_mokutil(tmp_path, monkeypatch)
    result = converge(tmp_path)
    assert result.status == Status.OK
    assert result.note.startswith("it runs under Secure Boot and whether DKMS's certificate "
                                  "/var/lib/dkms/mok.pub is enrolled cannot be told")  # fmt: skip


# ---- the rollout's preflight: the same reading, in its one round trip ------------------------

OPEN = PackagePin("nvidia-open", "580.126.20", "580.126.20-1", "driver")


def test_the_rollout_refuses_a_host_whose_certificate_is_not_enrolled_in_one_round_trip():
    commands: list[str] = []

    def run(host: str, command: str, timeout: float) -> CommandResult:
        commands.append(command)
        out = [f"{availability.SOURCE_MARK} yes", module_signing.MARK, "secure_boot=1",
               "setup_mode=0", "cert=/var/lib/dkms/mok.pub",
               f"test_key=/var/lib/dkms/mok.pub {NOT_ENROLLED}", availability.AUDIT_MARK,
               availability.POLICY_MARK, "nvidia-open:", "  Installed: (none)",
               "  Candidate: 580.126.20-1", "  Version table:", "     580.126.20-1 500",
               "        500 http://repo.example/cuda/debian12/x86_64  Packages"]  # fmt: skip
        return CommandResult(command, 0, "\n".join(out) + "\n", "")

    verdict = availability.check(
        {"g1": (OPEN,)}, run, refresh=True, kernels={"g1": ("6.1.0-28-amd64", "")}
    )
    (refusal,) = verdict.refusals
    assert (refusal.host, refusal.rule) == ("g1", "module-signing")
    assert refusal.message.startswith("it runs under Secure Boot and DKMS signs")
    assert refusal.message.endswith(
        "its kernel would reject the new module at the rollout's reboot, and the host would "
        "come back without its driver"
    )
    assert "mokutil --import /var/lib/dkms/mok.pub" in refusal.fix
    assert "nothing was drained" in refusal.fix
    (command,) = commands
    assert module_signing.MARK in command and "apt-cache policy" in command
