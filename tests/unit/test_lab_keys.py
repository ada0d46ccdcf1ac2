"""The lab's SSH key pairs: made once, kept, owner-only, remade when a half is missing."""

from __future__ import annotations

import stat

from deployer.lab.keys import ensure_ed25519, key_type_and_body


def test_a_new_pair_is_ed25519_owner_only_and_carries_the_comment(tmp_path):
    key = tmp_path / "sub" / "id_ed25519"
    public = ensure_ed25519(key, "gpumon-lab-x")
    assert public.startswith("ssh-ed25519 ") and public.endswith(" gpumon-lab-x")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_an_existing_pair_is_kept_as_it_is(tmp_path):
    key = tmp_path / "id_ed25519"
    first = ensure_ed25519(key, "a")
    assert ensure_ed25519(key, "b") == first


def test_a_pair_missing_its_public_half_is_made_again(tmp_path):
    key = tmp_path / "id_ed25519"
    first = ensure_ed25519(key, "a")
    key.with_suffix(".pub").unlink()
    again = ensure_ed25519(key, "a")
    assert again != first and key.with_suffix(".pub").read_text().strip() == again


def test_known_hosts_form_drops_the_comment():
    assert key_type_and_body("ssh-ed25519 AAAAC3 root@gpu01") == "ssh-ed25519 AAAAC3"
