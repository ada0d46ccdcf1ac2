"""Secret detection and masking: done on the data, before anything renders it."""

from __future__ import annotations

import pytest

from deployer.secrets import MASK, SecretValues, is_secret_key, mask, mask_text, secret_values_in


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "smtp_password",
        "ansible_password",
        "ansible_become_pass",
        "ansible_ssh_pass",
        "db_passwd",
        "ssl_passphrase",
        "client_secret",
        "grafana_admin_secret",
        "auth_token",
        "bearer_token",
        "github_token",
        "api_key",
        "apiKey",
        "opsgenie_api_key",
        "tls_private_key",
        "aws_secret_access_key",
        "pagerduty_service_key",
        "pagerduty_routing_key",
        "slack_api_url",
        "slack_webhook_url",
        "alertmanager_webhook_url",
        "registry_credentials",
    ],
)
def test_secret_names_are_recognised(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "ansible_ssh_private_key_file",
        "ansible_private_key_file",
        "vault_password_file",
        "tls_private_key_path",
        "token_dir",
        "nvidia_repo_key_url",
        "gpumon_host_key_policy",
        "gpumon_known_hosts_file",
        "ansible_user",
        "bypass_cache",
        "passwordless_sudo",
        "gpu_model",
        "alertmanager_url",
        42,
    ],
)
def test_non_secret_names_and_paths_to_secrets_are_not_secrets(name) -> None:
    assert not is_secret_key(name)


def test_mask_replaces_values_under_secret_keys_at_any_depth() -> None:
    data = {
        "smtp_password": "hunter2hunter2",
        "receivers": [{"name": "pager", "pagerduty_configs": [{"routing_key": "R0UT1NG"}]}],
        "gpu_model": "H100",
    }
    masked = mask(data, SecretValues())
    assert masked["smtp_password"] == MASK
    assert masked["receivers"][0]["pagerduty_configs"][0]["routing_key"] == MASK
    assert masked["gpu_model"] == "H100"


def test_mask_returns_a_copy_and_leaves_the_input_alone() -> None:
    data = {"api_key": "abcdef", "nested": {"token": "xyz123"}}
    mask(data, SecretValues())
    assert data == {"api_key": "abcdef", "nested": {"token": "xyz123"}}


def test_a_secret_key_holding_a_mapping_is_masked_whole() -> None:
    assert mask({"credentials": {"user": "u", "pass": "p"}}, SecretValues()) == {
        "credentials": MASK
    }


def test_unset_secrets_stay_visible() -> None:
    assert mask({"smtp_password": None, "api_key": ""}, SecretValues()) == {
        "smtp_password": None,
        "api_key": "",
    }


def test_registered_values_are_masked_inside_any_text() -> None:
    secrets = SecretValues(["s3cr3t-smtp"])
    diff = "-auth_password: old\n+auth_password: s3cr3t-smtp\n"
    assert mask_text(diff, secrets) == f"-auth_password: old\n+auth_password: {MASK}\n"
    assert mask({"content": diff}, secrets)["content"].count(MASK) == 1


def test_a_longer_secret_containing_a_shorter_one_is_masked_whole() -> None:
    secrets = SecretValues(["abcd", "abcdefgh"])
    assert mask_text("x abcdefgh y", secrets) == f"x {MASK} y"


def test_very_short_values_are_not_masked_as_substrings() -> None:
    secrets = SecretValues(["abc", 1])
    assert mask_text("abc 1", secrets) == "abc 1"
    assert len(secrets) == 0


def test_url_passwords_are_masked_keeping_the_user_and_host() -> None:
    text = "remote_write: https://thanos:Pa55w0rd@receive.lab:19291/api/v1/receive"
    assert mask_text(text, SecretValues()) == (
        f"remote_write: https://thanos:{MASK}@receive.lab:19291/api/v1/receive"
    )


def test_pem_private_keys_are_masked_anywhere() -> None:
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----"
    assert mask_text(f"key:\n{pem}\nend", SecretValues()) == f"key:\n{MASK}\nend"
    assert mask({"tls_key_pem": pem}, SecretValues()) == {"tls_key_pem": MASK}


def test_secret_values_in_finds_every_value_under_a_secret_key() -> None:
    data = {"a": {"smtp_password": "p1"}, "b": [{"token": "t1"}], "c": "plain"}
    assert sorted(secret_values_in(data)) == ["p1", "t1"]


def test_mask_text_uses_the_process_registry_by_default() -> None:
    from deployer.secrets import register_secret

    register_secret("registered-for-the-whole-run")
    assert mask_text("value=registered-for-the-whole-run") == f"value={MASK}"


def test_inventory_secrets_are_masked_in_text_produced_elsewhere(tmp_path) -> None:
    from deployer.inventory import load_inventory

    (tmp_path / "h.yml").write_text(
        "gpu:\n  vars:\n    slack_api_url: https://hooks.slack.example/T0/B0/XyZ\n"
        "  hosts:\n    gpu01:\n"
    )
    secrets = SecretValues()
    load_inventory(tmp_path / "h.yml", secrets=secrets)
    rendered = "api_url: https://hooks.slack.example/T0/B0/XyZ\n"
    assert mask_text(rendered, secrets) == f"api_url: {MASK}\n"


def test_role_default_secrets_are_registered_when_resolved(tmp_path) -> None:
    from deployer.inventory import load_inventory

    (tmp_path / "h.yml").write_text("gpu:\n  hosts:\n    gpu01:\n")
    secrets = SecretValues()
    inv = load_inventory(tmp_path / "h.yml", secrets=secrets)
    inv.resolve_vars("gpu01", {"grafana_admin_password": "default-pw"})
    assert "default-pw" in secrets
