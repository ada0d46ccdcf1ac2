"""Which variables are secrets, and masking them in the data (vars, diffs, errors) before rendering.

Masking happens here, in the data: reporters print what they are given, so everything shown to a
user (``inventory`` output, diffs, error messages) goes through :func:`mask` / :func:`mask_text`
first. Three things are masked:

- values under a secret-looking key (:func:`is_secret_key`), at any depth of a vars tree;
- secret-looking content wherever it appears: PEM private key blocks, the password in a URL's
  ``user:password@``;
- every value registered as secret, as a substring of any text (the inventory registers the
  values of all its secret keys in :data:`REGISTERED`, the process-wide registry; anything else,
  e.g. a password read from a host, is added with :func:`register_secret`), so a rendered
  template holding the SMTP password shows ``********`` in its diff too. Values shorter than
  :data:`MIN_REGISTERED_LENGTH` characters are not masked as substrings (masking ``"1"``
  everywhere would destroy the output); they are still masked under their own key.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "********"
MIN_REGISTERED_LENGTH = 4

# A key is split into words on "_", "-", "." and camelCase; one of these words (or word pairs)
# makes it secret.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pass",
        "pwd",
        "secret",
        "secrets",
        "token",
        "apikey",
        "webhook",
        "credential",
        "credentials",
        "bearer",
        "psk",
    }
)
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("private", "key"),
        ("access", "key"),
        ("secret", "key"),
        ("auth", "key"),
        ("service", "key"),  # PagerDuty (Alertmanager pagerduty_configs)
        ("routing", "key"),  # PagerDuty Events v2
        ("integration", "key"),
        ("user", "key"),  # Pushover
        ("slack", "api", "url"),  # Alertmanager's Slack webhook URL carries its token in the path
    }
)
# Words that make a key name a reference to a secret (a path, a file), not the secret itself.
_REFERENCE_SUFFIXES = frozenset({"file", "path", "dir", "filename", "directory"})

_PEM_PRIVATE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY( BLOCK)?-----.*?(-----END \1PRIVATE KEY( BLOCK)?-----|\Z)",
    re.DOTALL,
)
_URL_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@"
)


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[_\-.\s]+", spaced.lower()) if w]


def is_secret_key(name: Any) -> bool:
    """True when a variable (or nested key) named ``name`` holds a secret value.

    ``smtp_password``, ``ansible_become_pass``, ``grafana_api_key``, ``slack_webhook_url`` and
    ``tls_private_key`` are secrets; ``ansible_ssh_private_key_file`` and ``vault_password_file``
    are paths to secrets, and are not.
    """
    if not isinstance(name, str):
        return False
    return _is_secret_name(name)


# Pure in the name, and the same few names recur on every host of an inventory (judging each
# again was a fifth of loading 100,000 hosts).
@functools.lru_cache(maxsize=16384)
def _is_secret_name(name: str) -> bool:
    words = _words(name)
    if not words or words[-1] in _REFERENCE_SUFFIXES:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    for pair in _SECRET_PAIRS:
        n = len(pair)
        if any(tuple(words[i : i + n]) == pair for i in range(len(words) - n + 1)):
            return True
    return False


class SecretValues:
    """Values known to be secret in this run, masked as substrings of any text.

    :data:`REGISTERED` is the one a run uses; tests make their own. Safe to share between threads.
    """

    def __init__(self, values: Iterable[Any] = ()) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._ordered: tuple[str, ...] = ()
        for value in values:
            self.add(value)

    def add(self, value: Any) -> None:
        """Register ``value`` (a scalar, or every scalar inside a list/mapping) as secret."""
        if isinstance(value, Mapping):
            for item in value.values():
                self.add(item)
            return
        if isinstance(value, list | tuple | set | frozenset):
            for item in value:
                self.add(item)
            return
        if value is None or isinstance(value, bool):
            return
        text = str(value)
        if len(text) < MIN_REGISTERED_LENGTH:
            return
        with self._lock:
            if text in self._values:
                return
            self._values.add(text)
            # Longest first, so a secret containing another is masked whole.
            self._ordered = tuple(sorted(self._values, key=len, reverse=True))

    def __contains__(self, value: object) -> bool:
        return str(value) in self._values

    def __len__(self) -> int:
        return len(self._values)

    def replace_in(self, text: str) -> str:
        for value in self._ordered:
            if value in text:
                text = text.replace(value, MASK)
        return text


REGISTERED = SecretValues()


def register_secret(value: Any) -> None:
    """Mask ``value`` (or every scalar in it) wherever it appears from now on in this process."""
    REGISTERED.add(value)


def mask_text(text: str, secrets: SecretValues | None = None) -> str:
    """``text`` with secret values (``secrets``, by default :data:`REGISTERED`), PEM private keys
    and URL passwords replaced by MASK."""
    text = (REGISTERED if secrets is None else secrets).replace_in(text)
    if "PRIVATE KEY" in text:
        text = _PEM_PRIVATE.sub(MASK, text)
    if "@" in text:
        text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return text


def _is_empty(value: Any) -> bool:
    return value is None or value == ""


def mask(value: Any, secrets: SecretValues | None = None) -> Any:
    """A copy of ``value`` (any tree of mappings, lists and scalars) with secrets replaced by MASK;
    registered values are looked for in ``secrets``, by default :data:`REGISTERED`.

    Values under a secret key become MASK whole (a secret key holding a mapping is masked whole
    too); an unset (None or empty) secret stays visible, since it reveals nothing.
    """
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if is_secret_key(key) and not _is_empty(item):
                out[key] = MASK
            else:
                out[key] = mask(item, secrets)
        return out
    if isinstance(value, list | tuple):
        return [mask(item, secrets) for item in value]
    if isinstance(value, str):
        return mask_text(value, secrets)
    return value


def secret_values_in(value: Any) -> list[Any]:
    """Every value stored under a secret key anywhere in ``value`` (for registering them)."""
    found: list[Any] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if is_secret_key(key) and not _is_empty(item):
                found.append(item)
            else:
                found.extend(secret_values_in(item))
    elif isinstance(value, list | tuple):
        for item in value:
            found.extend(secret_values_in(item))
    return found
