"""What a run imports before it does anything: an ``up`` without TLS never loads the lab package
or the X.509 stack (each was a tenth or more of every run's start-up, bench/README.md
"Start-up"), and the lazily loaded ``lab`` command is still listed and runs."""

from __future__ import annotations

import subprocess
import sys

import click

HEAVY = ("deployer.lab", "cryptography.x509", "deployer.tls.ca")


def _imported_by(code: str) -> list[str]:
    probe = (
        f"{code}; import sys; "
        f"print('\\n'.join(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_resolving_up_imports_neither_the_lab_nor_the_x509_stack():
    code = (
        "import click; from deployer.cli import cli; "
        "cli.get_command(click.Context(cli), 'up'); "
        "from deployer.tls import material, rotation; material.forget(); rotation.directories()"
    )
    assert _imported_by(code) == []


def test_the_lab_command_is_listed_and_loaded_when_asked_for():
    from deployer.cli import cli

    ctx = click.Context(cli)
    assert "lab" in cli.list_commands(ctx)
    lab = cli.get_command(ctx, "lab")
    assert isinstance(lab, click.Group) and "up" in lab.list_commands(ctx)


def test_tls_material_still_issues_certificates_once_switched_on(tmp_path):
    """The X.509 stack comes with the first certificate asked for."""
    code = (
        "from pathlib import Path; from deployer.tls import material; "
        f"m = material.host_tls({{'gpumon_tls': True, 'gpumon_tls_dir': {str(tmp_path)!r}, "
        "'inventory_hostname': 'prom01', 'ansible_host': '10.0.0.1'}); "
        "assert 'BEGIN CERTIFICATE' in m['cert_pem']"
    )
    assert "cryptography.x509" in _imported_by(code)
