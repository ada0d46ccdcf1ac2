"""The grafana role as the engine plans it for a host: every file's content and mode, the
repository stanza, the unit's hardening, the admin password's life on the controller.

No Grafana package can be had here, so this is how the role is proven (README, Grafana)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from deployer.monitoring import dashboards
from deployer.monitoring.dashboards import of_inventory
from deployer.secrets import MASK, REGISTERED
from tests.unit.grafana_inventory import plan_grafana, write_inventory


@pytest.fixture(autouse=True)
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "controller-secrets"
    monkeypatch.setenv("GPUMON_SECRETS_DIR", str(d))
    return d


@pytest.fixture
def planned(tmp_path: Path):
    return plan_grafana(tmp_path)


def test_the_apt_repository_is_grafanas_signed_stable_main(planned):
    t = planned["Grafana repository (apt, deb822 signed-by keyring)"]
    assert t.args["uris"] == ["https://apt.grafana.com"]
    assert t.args["suites"] == ["stable"] and t.args["components"] == ["main"]
    assert t.args["key_url"] == "https://apt.grafana.com/gpg-full.key"
    text = t.module.source_content(t.args)
    assert "Signed-By: /etc/apt/keyrings/grafana.gpg" in text
    assert "Types: deb" in text and "URIs: https://apt.grafana.com" in text
    assert "trusted" not in text.lower()


def test_a_mirror_replaces_the_repository_and_its_key(tmp_path):
    planned = plan_grafana(
        tmp_path,
        json.dumps(
            {
                "grafana_apt_repository_url": "http://mirror.site/grafana/apt",
                "grafana_apt_key_url": "http://mirror.site/grafana/gpg-full.key",
            }
        ),
    )
    t = planned["Grafana repository (apt, deb822 signed-by keyring)"]
    assert t.args["uris"] == ["http://mirror.site/grafana/apt"]
    assert t.args["key_url"] == "http://mirror.site/grafana/gpg-full.key"


def test_a_redhat_host_gets_the_rpm_repository_with_gpg_checks(tmp_path):
    planned = plan_grafana(tmp_path, os_family="redhat")
    assert "Grafana repository (apt, deb822 signed-by keyring)" not in planned
    t = planned["Grafana repository (dnf, gpgcheck and repo_gpgcheck)"]
    text = t.module.content(t.args)
    assert "baseurl=https://rpm.grafana.com\n" in text
    assert "gpgcheck=1\n" in text and "repo_gpgcheck=1\n" in text
    assert "gpgkey=https://rpm.grafana.com/gpg.key\n" in text


def test_the_package_is_grafana_oss_of_the_11_6_line_held(planned):
    t = planned["grafana package 11.6.*"]
    assert t.args["name"] == ["grafana"]
    assert t.args["version"] == "11.6.*" and t.args["hold"] is True


def test_the_admin_password_is_generated_on_the_controller_0600(planned, secrets_dir):
    keep = secrets_dir / "grafana-admin-password-graf01"
    assert stat.S_IMODE(keep.stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    value = keep.read_text().strip()
    assert len(value) == 32
    t = planned["admin password (0640, masked)"]
    assert t.args["content"] == value + "\n"
    assert t.args["mode"] == "640" and t.args["group"] == "grafana"
    assert "content" in t.secret_args
    assert value in REGISTERED  # masked wherever it would be printed


def test_a_second_run_keeps_the_generated_password(tmp_path, secrets_dir):
    first = plan_grafana(tmp_path)["admin password (0640, masked)"].args["content"]
    second = plan_grafana(tmp_path)["admin password (0640, masked)"].args["content"]
    assert first == second


def test_a_given_password_is_used_and_nothing_generated(tmp_path, secrets_dir):
    planned = plan_grafana(tmp_path, json.dumps({"grafana_admin_password": "chosen-by-the-site"}))
    assert planned["admin password (0640, masked)"].args["content"] == "chosen-by-the-site\n"
    assert not secrets_dir.exists()


def test_a_kept_password_others_can_read_is_refused(tmp_path, secrets_dir):
    from deployer.errors import InputError

    plan_grafana(tmp_path)
    keep = secrets_dir / "grafana-admin-password-graf01"
    os.chmod(keep, 0o644)
    secret = keep.read_text().strip()
    with pytest.raises(InputError, match=r"readable by others.*delete it to have a new") as err:
        plan_grafana(tmp_path)
    assert secret not in str(err.value)


def test_grafana_ini_reads_the_password_from_its_file_and_keeps_anonymous_off(planned):
    ini = planned["grafana.ini"].args["content"]
    value = planned["admin password (0640, masked)"].args["content"].strip()
    assert value not in ini
    assert "admin_password = $__file{/etc/grafana/gpumon/admin-password}\n" in ini
    assert "[auth.anonymous]\nenabled = false\n" in ini
    assert "allow_sign_up = false" in ini and "reporting_enabled = false" in ini
    assert "check_for_updates = false" in ini
    assert planned["grafana.ini"].args["mode"] == "640"


def test_tls_when_both_certificate_and_key_are_given(tmp_path):
    planned = plan_grafana(
        tmp_path,
        json.dumps(
            {"grafana_tls_cert_file": "/etc/ssl/g.crt", "grafana_tls_key_file": "/etc/ssl/g.key"}
        ),
    )
    ini = planned["grafana.ini"].args["content"]
    assert "protocol = https\ncert_file = /etc/ssl/g.crt\ncert_key = /etc/ssl/g.key\n" in ini
    assert "cookie_secure = true" in ini
    assert planned["grafana answers /api/health"].args["url"].startswith("https://127.0.0.1:3000")


def datasources(planned) -> list[dict]:
    return yaml.safe_load(
        planned["datasources (global view and replicas, fixed uids)"].args["content"]
    )["datasources"]


def test_datasources_are_the_replicas_with_fixed_uids_without_a_global_view(planned):
    ds = datasources(planned)
    assert [(d["uid"], d["url"], d["isDefault"]) for d in ds] == [
        ("gpumon-replica-prom01", "http://192.0.2.21:9090", True),
        ("gpumon-replica-prom02", "http://192.0.2.22:9090", False),
    ]
    assert all(d["type"] == "prometheus" and d["editable"] is False for d in ds)


def test_the_global_view_url_is_the_first_and_default_datasource(tmp_path):
    planned = plan_grafana(tmp_path, json.dumps({"grafana_global_view_url": "http://vm01:8428"}))
    ds = datasources(planned)
    assert (ds[0]["uid"], ds[0]["url"], ds[0]["isDefault"]) == (
        "gpumon-global",
        "http://vm01:8428",
        True,
    )
    assert [d["isDefault"] for d in ds] == [True, False, False]


def test_thanos_query_is_the_global_view_where_the_thanos_role_deploys_it(tmp_path):
    import copy

    from tests.unit.grafana_inventory import INVENTORY

    data = copy.deepcopy(INVENTORY)
    data["all"]["hosts"]["q01"] = {"ansible_host": "192.0.2.41"}
    data["all"]["children"]["monitoring"]["children"]["thanos_query"] = {"hosts": {"q01": {}}}
    auto = datasources(plan_grafana(tmp_path, data=data))
    assert "gpumon-global" not in [d["uid"] for d in auto]  # auto without an archive: no Thanos
    on = datasources(plan_grafana(tmp_path, json.dumps({"thanos_enabled": True}), data=data))
    assert (on[0]["uid"], on[0]["url"]) == ("gpumon-global", "http://192.0.2.41:19192")


def test_datasource_basic_auth_is_secure_json_and_masked(tmp_path):
    planned = plan_grafana(
        tmp_path,
        json.dumps(
            {
                "grafana_datasource_basic_auth_user": "g",
                "grafana_datasource_basic_auth_password": "s3cret-pw",
            }
        ),
    )
    t = planned["datasources (global view and replicas, fixed uids)"]
    d = yaml.safe_load(t.args["content"])["datasources"][0]
    assert d["basicAuthUser"] == "g" and d["secureJsonData"] == {"basicAuthPassword": "s3cret-pw"}
    assert "content" in t.secret_args and t.args["mode"] == "640"


def test_the_dashboard_provider_reads_the_generated_files_read_only(planned):
    doc = yaml.safe_load(
        planned["dashboard provider (files, not editable in the UI)"].args["content"]
    )
    (p,) = doc["providers"]
    assert p["type"] == "file" and p["allowUiUpdates"] is False and p["disableDeletion"] is True
    assert p["options"]["path"] == "/var/lib/grafana/dashboards/gpumon"


def test_one_file_per_dashboard_exactly_the_generated_json(tmp_path, planned):
    files = {t.args["dest"]: t for n, t in planned.items() if n.startswith("dashboard gpumon-")}
    dashboards._built.cache_clear()
    _, built = of_inventory.for_inventory(write_inventory(tmp_path))
    assert sorted(files) == sorted(f"/var/lib/grafana/dashboards/gpumon/{u}.json" for u in built)
    for uid, d in built.items():
        t = files[f"/var/lib/grafana/dashboards/gpumon/{uid}.json"]
        assert t.args["content"] == dashboards.encode(d)
        assert t.args["mode"] == "640"


def test_a_dashboard_the_inventory_no_longer_calls_for_is_removed(tmp_path):
    import copy

    from tests.unit.grafana_inventory import INVENTORY

    data = copy.deepcopy(INVENTORY)
    del data["all"]["hosts"]["gpu03"]["gpu_mig"]
    planned = plan_grafana(tmp_path, data=data)
    t = planned["no dashboard gpumon-mig (the inventory no longer calls for it)"]
    assert t.args["path"] == "/var/lib/grafana/dashboards/gpumon/gpumon-mig.json"
    assert t.args["state"] == "absent"


def test_the_packages_unit_is_hardened_by_a_drop_in(planned):
    t = planned["grafana-server hardened, enabled and running"]
    assert t.args["name"] == "grafana-server.service"
    text = t.args["dropins"]["gpumon-hardening.conf"]
    for line in (
        "NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=/var/lib/grafana /var/log/grafana",
        "CapabilityBoundingSet=", "PrivateTmp=yes", "SystemCallFilter=@system-service",
    ):  # fmt: skip
        assert line + "\n" in text


def test_the_admin_password_reset_reads_stdin_never_the_command_line(planned):
    t = planned["admin password in force"]
    value = planned["admin password (0640, masked)"].args["content"].strip()
    assert "--password-from-stdin < /etc/grafana/gpumon/admin-password" in t.args["cmd"]
    assert t.args["cmd"].startswith("runuser -u grafana -- ")
    assert value not in t.args["cmd"] and value not in t.args["unless"]
    assert "curl -fsS --max-time 10 -K - http://127.0.0.1:3000/api/user" in t.args["unless"]


def test_config_changes_restart_and_wait_for_health(planned):
    assert planned["grafana.ini"].notify == ("restart grafana", "grafana answers after restart")
    assert planned["restart grafana"].args["state"] == "restarted"
    assert (
        planned["grafana answers after restart"].args["url"] == "http://127.0.0.1:3000/api/health"
    )


def test_dashboards_alone_restart_nothing(planned):
    assert all(not t.notify for n, t in planned.items() if n.startswith("dashboard gpumon-"))


def test_the_password_is_masked_in_a_diff(planned):
    from deployer.secrets import mask_text

    value = planned["admin password (0640, masked)"].args["content"].strip()
    assert mask_text(f"+{value}") == f"+{MASK}"
