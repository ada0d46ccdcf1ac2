"""Argument validation of every module: bad arguments are refused with an ArgError naming the key."""

from __future__ import annotations

import pytest

from deployer.modules import MODULES
from deployer.modules.base import ArgError

OK_ARGS = {
    "package": {"name": "curl"},
    "apt_repository": {
        "name": "nvidia",
        "uris": "http://repo/",
        "suites": "/",
        "key_url": "http://repo/key.asc",
    },
    "apt_preferences": {"name": "nvidia", "pin": "version 580.*", "priority": 1001},
    "dnf_repository": {"name": "cuda", "baseurl": "http://repo/", "gpgkey": "http://repo/k"},
    "systemd_unit": {"name": "node_exporter", "state": "started"},
    "group": {"name": "prometheus"},
    "user": {"name": "prometheus"},
    "command": {"cmd": "true", "creates": "/x"},
    "archive": {"url": "http://m/a.tar.gz", "dest": "/opt/a", "sha256": "a" * 64},
    "wait_for": {"port": 9100},
    "reboot": {},
    "assert": {"that": "true"},
    "disk_space": {"needs": {"/boot": 128}},
    "boot_loader": {"running": "6.1.0-28-amd64"},
    "module_signing": {},
    "driver_module": {"version": "595.45.04", "running": "6.1.0-28-amd64"},
    "nvidia_driver_switch": {"purge": ["cuda-drivers-535"]},
    "copy_by_mig_mode": {"dest": "/etc/x.csv", "content": "a", "mig_content": "b"},
}


@pytest.mark.parametrize("module", sorted(OK_ARGS))
def test_minimal_arguments_are_accepted(module: str) -> None:
    MODULES[module]().validate(dict(OK_ARGS[module]))


@pytest.mark.parametrize("module", sorted(OK_ARGS))
def test_unknown_argument_is_refused_by_name(module: str) -> None:
    with pytest.raises(ArgError) as err:
        MODULES[module]().validate({**OK_ARGS[module], "bogus_key": 1})
    assert err.value.key == "bogus_key"


def test_every_registered_module_has_an_argument_table_entry() -> None:
    mine = set(MODULES) - {"copy", "template", "file", "directory"}
    assert mine == set(OK_ARGS)


BAD = [
    # (module, args, key named)
    ("package", {}, "name"),
    ("package", {"name": 3}, "name"),
    ("package", {"name": "curl", "state": "installed"}, "state"),
    ("package", {"name": "curl=1.0"}, "name"),
    ("package", {"name": ["a", "a"]}, "name"),
    ("package", {"name": []}, "name"),
    ("package", {"name": "curl", "version": "1.0", "state": "absent"}, "version"),
    ("package", {"name": "curl", "version": "1.0 2"}, "version"),
    ("package", {"name": "curl", "hold": True, "state": "absent"}, "hold"),
    ("package", {"name": "curl", "hold": "maybe"}, "hold"),
    ("package", {"name": "curl", "cache_valid_time": 60}, "cache_valid_time"),
    ("package", {"name": "curl", "manager": "yum"}, "manager"),
    ("apt_repository", {**OK_ARGS["apt_repository"], "trusted": True}, "trusted"),
    ("apt_repository", {**OK_ARGS["apt_repository"], "trusted": "yes"}, "trusted"),
    ("apt_repository", {**OK_ARGS["apt_repository"], "name": "../x"}, "name"),
    ("apt_repository", {**OK_ARGS["apt_repository"], "uris": "repo"}, "uris"),
    ("apt_repository", {**OK_ARGS["apt_repository"], "key": "k"}, "key_url"),
    (
        "apt_repository",
        {k: v for k, v in OK_ARGS["apt_repository"].items() if k != "key_url"},
        "key_url",
    ),
    ("apt_repository", {**OK_ARGS["apt_repository"], "suites": "bookworm"}, "components"),
    ("apt_repository", {**OK_ARGS["apt_repository"], "components": "main"}, "components"),
    ("apt_repository", {**OK_ARGS["apt_repository"], "types": "rpm"}, "types"),
    (
        "apt_repository",
        {k: v for k, v in OK_ARGS["apt_repository"].items() if k != "key_url"}
        | {
            "key": "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!\n-----END PGP PUBLIC KEY BLOCK-----"
        },
        "key",
    ),
    ("apt_preferences", {"name": "x", "pin": "version 1"}, "priority"),
    ("apt_preferences", {"name": "x", "pin": "580.*", "priority": 1}, "pin"),
    ("dnf_repository", {**OK_ARGS["dnf_repository"], "gpgcheck": 0}, "gpgcheck"),
    ("dnf_repository", {"name": "cuda", "baseurl": "http://repo/"}, "gpgkey"),
    ("systemd_unit", {"name": "x"}, "state"),
    ("systemd_unit", {"name": "x y", "state": "started"}, "name"),
    ("systemd_unit", {"name": "x", "state": "running"}, "state"),
    ("systemd_unit", {"name": "x", "masked": True, "state": "started"}, "masked"),
    ("systemd_unit", {"name": "x", "masked": True, "content": "[Unit]\n"}, "masked"),
    ("systemd_unit", {"name": "x", "content": "a", "src": "b"}, "content"),
    ("systemd_unit", {"name": "x", "dropins": {"a/b": "x"}}, "dropins"),
    ("systemd_unit", {"name": "x", "enabled": "sometimes"}, "enabled"),
    ("group", {"name": "Bad Name"}, "name"),
    ("group", {"name": "g", "gid": -1}, "gid"),
    ("user", {"name": "u", "shell": "nologin"}, "shell"),
    ("user", {"name": "u", "groups": "video"}, "groups"),
    ("user", {"name": "u", "comment": "a:b"}, "comment"),
    ("user", {"name": "u", "uid": "abc"}, "uid"),
    ("command", {"cmd": "make"}, "cmd"),
    ("command", {"cmd": "make", "creates": "out"}, "creates"),
    ("command", {"cmd": "make", "changed_when": True, "environment": {"1X": "y"}}, "environment"),
    ("command", {"cmd": "make", "changed_when": True, "chdir": "rel"}, "chdir"),
    ("archive", {"url": "http://m/a.tgz", "dest": "/opt/a"}, "sha256"),
    ("archive", {**OK_ARGS["archive"], "checksum_url": "http://m/s"}, "sha256"),
    ("archive", {**OK_ARGS["archive"], "sha256": "abc"}, "sha256"),
    ("archive", {**OK_ARGS["archive"], "dest": "/"}, "dest"),
    ("archive", {**OK_ARGS["archive"], "creates": "../x"}, "creates"),
    ("archive", {**OK_ARGS["archive"], "url": "ftp:/x"}, "url"),
    ("wait_for", {}, "port"),
    ("wait_for", {"port": 1, "url": "http://x/"}, "port"),
    ("wait_for", {"port": 70000}, "port"),
    ("wait_for", {"port": 1, "contains": "ok"}, "contains"),
    ("wait_for", {"port": 1, "timeout": 0}, "timeout"),
    ("wait_for", {"port": 1, "timeout": 5, "interval": 10}, "interval"),
    ("disk_space", {}, "needs"),
    ("disk_space", {"needs": "/boot"}, "needs"),
    ("disk_space", {"needs": {"boot": 1}}, "needs"),
    ("disk_space", {"needs": {"/boot; reboot": 1}}, "needs"),
    ("disk_space", {"needs": {"/boot": -1}}, "needs"),
    ("disk_space", {"needs": {"/boot": "1G"}}, "needs"),
    ("boot_loader", {}, "running"),
    ("boot_loader", {"running": ""}, "running"),
    ("boot_loader", {"running": "6.1.0-28-amd64; reboot"}, "running"),
    ("boot_loader", {"running": "6.1.0-28-amd64", "newest": "$(reboot)"}, "newest"),
    ("module_signing", {"purpose": " "}, "purpose"),
    ("driver_module", {"running": "6.1.0-28-amd64"}, "version"),
    (
        "driver_module",
        {"version": "595.45.04", "running": "6.1.0-28-amd64", "newest": "$(x)"},
        "newest",
    ),
    ("reboot", {"reboot_timeout": 1}, "reboot_timeout"),
    ("reboot", {"reboot_timeout": True}, "reboot_timeout"),
]


@pytest.mark.parametrize(("module", "args", "key"), BAD, ids=[f"{m}-{k}" for m, _, k in BAD])
def test_bad_argument_is_refused_naming_the_key(module: str, args: dict, key: str) -> None:
    with pytest.raises(ArgError) as err:
        MODULES[module]().validate(dict(args))
    assert err.value.key == key


def test_command_without_a_guard_names_the_three_guards() -> None:
    with pytest.raises(ArgError) as err:
        MODULES["command"]().validate({"cmd": "make install"})
    assert all(k in err.value.message for k in ("creates", "unless", "changed_when"))


def test_apt_repository_trusted_is_refused_with_a_reason() -> None:
    with pytest.raises(ArgError) as err:
        MODULES["apt_repository"]().validate({**OK_ARGS["apt_repository"], "trusted": "yes"})
    assert "refused" in err.value.message
