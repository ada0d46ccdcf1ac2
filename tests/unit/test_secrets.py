"""Secret detection and masking: by name and place in data, by content and registered value in
free text; done on the data, before anything renders it."""

from __future__ import annotations

import pytest

from deployer.secrets import (
    ALERTMANAGER_SECRET_FIELDS,
    MASK,
    SecretValues,
    is_secret_key,
    is_secret_path,
    mask,
    mask_content,
    mask_text,
    secret_values_in,
)
from tests.reality import inventory_corpus_dir

# ---------------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "smtp_password",
        "ansible_password",
        "ansible_become_pass",
        "ansible_ssh_pass",
        "db_passwd",
        "ldap_bind_pw",
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
        "api_url",
        "slack_api_url",
        "alertmanager_slack_api_url",
        "slack_webhook_url",
        "alertmanager_webhook_url",
        "teams_webhook",
        "registry_credentials",
        "rocketchat_token_id",
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
        "ssh_server_password_login",  # DeepOps: a boolean setting about passwords
        "password_min_length",
        "token_ttl",
        "secret_name",
        "webhook_configs",
        "token_url",  # OAuth2's token endpoint (prometheus/common: a plain string)
        "pagerduty_url",  # Alertmanager types it a URL, not a SecretURL
        "opsgenie_api_url",
        "secret.yml",
        42,
    ],
)
def test_non_secret_names_paths_and_settings_are_not_secrets(name) -> None:
    assert not is_secret_key(name)


@pytest.mark.parametrize(("place", "field", "source"), ALERTMANAGER_SECRET_FIELDS)
def test_every_field_alertmanager_types_as_a_secret_is_one_in_its_place(place, field, source):
    parents = () if place == "*" else ("alertmanager_receivers", f"{place}_configs")
    if place == "tls_config":
        parents = ("http_config", "tls_config")
    assert is_secret_key(field, parents), source


@pytest.mark.parametrize(("place", "field", "source"), ALERTMANAGER_SECRET_FIELDS)
def test_the_file_a_secret_is_read_from_is_not_a_secret(place, field, source):
    parents = () if place == "*" else (f"{place}_configs",)
    assert not is_secret_key(f"{field}_file", parents), source


def test_a_url_is_secret_in_a_webhook_config_and_not_elsewhere() -> None:
    assert is_secret_key("url", ("alertmanager_receivers", "webhook_configs"))
    assert is_secret_key("url", ("eventrecorder", "webhook_outputs"))
    assert not is_secret_key("url", ("alertmanager_receivers", "pagerduty_configs"))
    assert not is_secret_key("url")


def test_a_tls_key_is_secret_only_in_a_tls_config() -> None:
    assert is_secret_key("key", ("http_config", "tls_config"))
    assert not is_secret_key("key", ("labels",))


def test_a_key_path_through_a_secret_name_is_secret() -> None:
    assert is_secret_path("alertmanager_receivers[0].slack_configs[0].api_url")
    assert is_secret_path("alertmanager_receivers[1].webhook_configs[0].url")
    assert is_secret_path("registry_credentials.user")
    assert not is_secret_path("alertmanager_receivers[0].name")


# ---------------------------------------------------------------------------------- data


def test_mask_replaces_values_under_secret_keys_at_any_depth() -> None:
    data = {
        "smtp_password": "hunter2hunter2",
        "receivers": [{"name": "pager", "pagerduty_configs": [{"routing_key": "R0UT1NG"}]}],
        "gpu_model": "H100",
    }
    masked = mask(data)
    assert masked["smtp_password"] == MASK
    assert masked["receivers"][0]["pagerduty_configs"][0]["routing_key"] == MASK
    assert masked["gpu_model"] == "H100"


def test_a_slack_receivers_api_url_is_masked_in_a_list_of_receivers() -> None:
    receivers = [
        {
            "name": "oncall",
            "slack_configs": [{"api_url": "https://hooks.slack.com/services/T0/B0/T0K3N"}],
            "webhook_configs": [{"url": "https://relay.example/alert/T0K3N2", "max_alerts": 5}],
            "pagerduty_configs": [{"url": "https://events.pagerduty.com/v2/enqueue"}],
        }
    ]
    (masked,) = mask({"alertmanager_receivers": receivers})["alertmanager_receivers"]
    assert masked["slack_configs"] == [{"api_url": MASK}]
    assert masked["webhook_configs"] == [{"url": MASK, "max_alerts": 5}]
    assert masked["pagerduty_configs"] == [{"url": "https://events.pagerduty.com/v2/enqueue"}]
    assert masked["name"] == "oncall"


def test_mask_returns_a_copy_and_leaves_the_input_alone() -> None:
    data = {"api_key": "abcdef", "nested": {"token": "xyz123"}}
    mask(data)
    assert data == {"api_key": "abcdef", "nested": {"token": "xyz123"}}


def test_a_secret_key_holding_a_mapping_is_masked_whole() -> None:
    assert mask({"credentials": {"user": "u", "pass": "p"}}) == {"credentials": MASK}


def test_unset_secrets_stay_visible() -> None:
    assert mask({"smtp_password": None, "api_key": ""}) == {"smtp_password": None, "api_key": ""}


def test_booleans_under_secret_names_stay_visible() -> None:
    assert mask({"kube_webhook_token_auth": False, "smtp_password": True}) == {
        "kube_webhook_token_auth": False,
        "smtp_password": True,
    }


def test_numbers_under_secret_names_are_masked() -> None:
    assert mask({"ansible_become_pass": 123456}) == {"ansible_become_pass": MASK}


def test_a_value_equal_to_a_secret_elsewhere_is_not_masked_in_data() -> None:
    secrets = SecretValues(["vagrant"])
    data = {"ansible_user": "vagrant", "ansible_password": "vagrant", "home": "/home/vagrant"}
    masked = mask(data)
    assert masked == {"ansible_user": "vagrant", "ansible_password": MASK, "home": "/home/vagrant"}
    assert "vagrant" in secrets  # registered, and still not looked for in data


def test_a_url_password_is_masked_under_any_name_keeping_the_user_and_host() -> None:
    remote = "https://thanos:Pa55w0rd@receive.lab:19291/api/v1/receive"
    assert mask({"remote_write_url": remote}) == {
        "remote_write_url": f"https://thanos:{MASK}@receive.lab:19291/api/v1/receive"
    }


def test_a_webhook_url_under_a_plain_name_has_its_token_masked() -> None:
    assert mask({"notify": "https://hooks.slack.com/services/T0/B0/T0K3N"}) == {
        "notify": f"https://hooks.slack.com/services/{MASK}"
    }


def test_secret_values_in_finds_every_value_under_a_secret_key_in_its_place() -> None:
    data = {
        "a": {"smtp_password": "p1"},
        "b": [{"token": "t1"}],
        "c": "plain",
        "r": [{"webhook_configs": [{"url": "https://relay/x"}]}],
        "flag": {"password_enabled": True, "smtp_password": False},
    }
    assert sorted(secret_values_in(data)) == ["https://relay/x", "p1", "t1"]


# ---------------------------------------------------------------------------------- text


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (
            "-e: a=1 alertmanager_smtp_auth_password=hunter2 bad: expected key=value, got 'bad'",
            f"-e: a=1 alertmanager_smtp_auth_password={MASK} bad: expected key=value, got 'bad'",
        ),
        (
            "expected key=value in [all:vars], got 'ansible_password: secret phrase'",
            f"expected key=value in [all:vars], got 'ansible_password: {MASK}'",
        ),
        (
            '{"smtp_password": "hunter2", "user": "x"}',
            f'{{"smtp_password": "{MASK}", "user": "x"}}',
        ),
        ("{'token': 'abc', 'b': 1}", f"{{'token': '{MASK}', 'b': 1}}"),
        (
            "smtp_auth_password: s3cret # rotated\nfrom: a@b",
            f"smtp_auth_password: {MASK} # rotated\nfrom: a@b",
        ),
        ("--web.password=xyz --listen=:9090", f"--web.password={MASK} --listen=:9090"),
        ("ansible_become_pass = my long pass", f"ansible_become_pass = {MASK}"),
        ('smtp_password="unclosed', f'smtp_password="{MASK}'),
        ("api_url: https://hooks.slack.com/services/T0/B0/XYZ", f"api_url: {MASK}"),
        (
            "POST https://discord.com/api/webhooks/123/tok failed",
            f"POST https://discord.com/api/webhooks/{MASK} failed",
        ),
        ("GET https://api.telegram.org/bot123:ABC/send", f"GET https://api.telegram.org/bot{MASK}"),
        (
            "https://prod.logic.azure.com/wf?api-version=1&sig=S1G",
            f"https://prod.logic.azure.com/wf?api-version=1&sig={MASK}",
        ),
        ("Authorization: Bearer abc.def", f"Authorization: Bearer {MASK}"),
        (
            "clone https://ghp_0123456789abcdefghij@github.com/o/r",
            f"clone https://{MASK}@github.com/o/r",
        ),
    ],
)
def test_secrets_in_text_are_masked_by_their_name_or_their_shape(text: str, masked: str) -> None:
    assert mask_content(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "ansible_user: vagrant",
        "ssh_server_password_login: true",
        "smtp_password: ********",
        "gpumon_host_key_policy=accept-new",
        "host key for [127.0.0.1]:2222 does not match",
        "roles/alertmanager/templates/secret.yml.j2:12: template error",
        "ssh://git@github.com/o/r",
        "http://admin@mirror.lab/",
    ],
)
def test_plain_text_is_left_alone(text: str) -> None:
    assert mask_content(text) == text


def test_registered_values_are_masked_inside_any_text() -> None:
    secrets = SecretValues(["s3cr3t-smtp"])
    diff = "-auth: old\n+auth: s3cr3t-smtp\n"
    assert mask_text(diff, secrets) == f"-auth: old\n+auth: {MASK}\n"


def test_a_longer_secret_containing_a_shorter_one_is_masked_whole() -> None:
    secrets = SecretValues(["abcd", "abcdefgh"])
    assert mask_text("x abcdefgh y", secrets) == f"x {MASK} y"


def test_very_short_values_and_literals_are_not_registered() -> None:
    secrets = SecretValues(["abc", 1, True, "true", "none"])
    assert mask_text("abc 1 true none", secrets) == "abc 1 true none"
    assert len(secrets) == 0


def test_pem_private_keys_are_masked_anywhere() -> None:
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----"
    assert mask_text(f"key:\n{pem}\nend", SecretValues()) == f"key:\n{MASK}\nend"
    assert mask({"tls_key_pem": pem}) == {"tls_key_pem": MASK}


def test_mask_text_uses_the_process_registry_by_default() -> None:
    from deployer.secrets import register_secret

    register_secret("registered-for-the-whole-run")
    assert mask_text("value=registered-for-the-whole-run") == f"value={MASK}"


# ---------------------------------------------------------------------------------- inventories


def test_inventory_secrets_are_masked_in_text_produced_elsewhere(tmp_path) -> None:
    from deployer.inventory import load_inventory

    (tmp_path / "h.yml").write_text(
        "gpu:\n  vars:\n    alertmanager_receivers:\n      - name: hook\n"
        "        webhook_configs: [{url: 'https://relay.example/T0/XyZ'}]\n"
        "  hosts:\n    gpu01:\n"
    )
    secrets = SecretValues()
    load_inventory(tmp_path / "h.yml", secrets=secrets)
    rendered = "url: https://relay.example/T0/XyZ\n"
    assert mask_text(rendered, secrets) == f"url: {MASK}\n"


def test_role_default_secrets_are_registered_when_resolved(tmp_path) -> None:
    from deployer.inventory import load_inventory

    (tmp_path / "h.yml").write_text("gpu:\n  hosts:\n    gpu01:\n")
    secrets = SecretValues()
    inv = load_inventory(tmp_path / "h.yml", secrets=secrets)
    inv.resolve_vars("gpu01", {"grafana_admin_password": "default-pw"})
    assert "default-pw" in secrets


def test_deepops_inventory_masks_its_passwords_and_nothing_else() -> None:
    """DeepOps' virtual cluster: ``ansible_user=vagrant`` and ``ansible_password=vagrant``; its
    users' ``password`` hashes, MAAS admin password 'admin' beside ``username: admin``, and a
    boolean ``ssh_server_password_login`` (issue 14, 1.9)."""
    from deployer.inventory import load_inventory

    path = inventory_corpus_dir() / "deepops" / "virtual-full" / "inventory"
    if not path.is_file():
        pytest.skip(f"inventory corpus not found: {path}")
    inv = load_inventory(path, secrets=SecretValues())
    shown = inv.to_dict(host="virtual-gpu01")["vars"]
    raw = inv.to_dict(host="virtual-gpu01", mask_secrets=False)["vars"]
    assert shown["ansible_user"] == "vagrant"
    assert shown["ansible_password"] == MASK
    assert shown["ssh_server_password_login"] is True
    assert shown["maas_adminusers"] == [
        {"username": "admin", "email": "admin@{{ maas_dns_domain }}", "password": MASK}
    ]
    assert [u["password"] for u in shown["users"]] == [MASK]
    assert shown["users"][0]["username"] == raw["users"][0]["username"] == "nvidia"
    masked = sorted(k for k, v in shown.items() if v == MASK)
    assert masked == ["ansible_password", "slurm_db_password", "slurm_password"]


def test_a_failed_commands_output_in_a_task_error_is_masked(tmp_path) -> None:
    """Command output shown in a failure: a token printed by name, a URL's password, and a value
    registered as secret, through the real executor and a local connection."""
    from deployer.connection import LocalConnection
    from deployer.executor import Executor
    from deployer.plan import Planner
    from deployer.roles import Play
    from deployer.secrets import register_secret

    register_secret("Zk9-registered-s3cret")
    tasks = tmp_path / "roles" / "leaky" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(
        "- name: leak\n  command:\n    cmd: >-\n"
        "      echo 'auth_token=Zk9T0K3N https://u:Zk9pw@h/ Zk9-registered-s3cret' >&2; exit 3\n"
        "    changed_when: false\n"
    )

    class OneHost:
        hosts = {"h1": None}
        groups = {"all": None}

        def group_hosts(self, group: str) -> list[str]:
            return ["h1"]

        def resolve_vars(self, host: str, defaults: dict) -> dict:
            return dict(defaults)

    play = Play(name="leaky", hosts="all", roles=("leaky",))
    planner = Planner(OneHost(), [tmp_path / "roles"], None)
    planner.load_roles((play,))
    report = Executor(LocalConnection).run([planner.plan_host("h1", [play])], (play,))
    (task,) = report.hosts["h1"].tasks
    assert task.error and "auth_token=" in task.error
    assert "Zk9" not in task.error and "Zk9" not in str(report.to_json())
