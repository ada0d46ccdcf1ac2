"""upgrade-driver --output json: the run's options as given, never a secret among them."""

from __future__ import annotations

import json

from deployer.rollout.command import _shown
from deployer.secrets import MASK, register_secret


def test_a_password_given_with_e_is_masked_in_the_printed_run_and_the_json_stays_json():
    data = {"options": {"extra_vars": ["gpumon_tls=true", "gpumon_basic_auth_password=rot-1234"]}}
    shown = _shown(data)
    assert "rot-1234" not in shown
    assert json.loads(shown)["options"]["extra_vars"] == [
        "gpumon_tls=true",
        f"gpumon_basic_auth_password={MASK}",
    ]


def test_a_registered_secret_is_masked_wherever_the_run_shows_it():
    register_secret("s3cr3t-token-5678")
    shown = _shown({"hosts": {"gpu01": {"note": "webhook said s3cr3t-token-5678"}}})
    assert "s3cr3t-token-5678" not in shown and MASK in shown
