"""Which values are secrets, and masking them in the data (vars, diffs, errors) before rendering.

Masking happens here, in the data: reporters print what they are given, so everything shown to a
user (``inventory`` output, diffs, error messages, command output in failures) goes through
:func:`mask` or :func:`mask_text` first.

Structured data (:func:`mask`) is masked by name and place, never by a value's equality with
another value:

- a value under a secret name (:func:`is_secret_key`), at any depth of a tree of mappings and
  lists; a name is secret by its words (``*_password``, ``*_token``, ``api_key``, ...), or by its
  place in Alertmanager's configuration (``url`` in ``webhook_configs``, ``key`` in
  ``tls_config``: :data:`ALERTMANAGER_SECRET_FIELDS`, the fields Alertmanager itself types as
  secrets). Booleans, ``None`` and ``""`` under a secret name stay visible: they reveal nothing.
- secret content inside any string: PEM private key blocks, the userinfo of a URL, the token part
  of webhook URLs (Slack, Discord, Teams, Mattermost/Rocket.Chat, Telegram, PagerDuty), secret
  query parameters, and ``name=value`` / ``name: value`` pairs whose name is secret.

Free text (:func:`mask_text`: error messages, command output, diffs) has no names to go by where a
secret was rendered into it, so besides the content rules above it masks every value registered
as secret (the inventory registers the values under its secret names in :data:`REGISTERED`)
wherever it appears. Values shorter than :data:`MIN_REGISTERED_LENGTH` characters are not
registered (masking ``"1"`` everywhere would destroy the output); they are still masked under
their own name.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "********"
MIN_REGISTERED_LENGTH = 4

# A name is split into words on "_", "-", ".", spaces and camelCase; one of these words (or word
# sequences) anywhere in it makes it secret, unless its last word says it is a reference to a
# secret or a setting about one (below).
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwords",
        "passwd",
        "passphrase",
        "pass",
        "pwd",
        "pw",
        "secret",
        "secrets",
        "token",
        "tokens",
        "apikey",
        "webhook",
        "credential",
        "credentials",
        "bearer",
        "psk",
    }
)
_SECRET_SEQUENCES = frozenset(
    {
        ("api", "key"),
        ("private", "key"),
        ("access", "key"),
        ("secret", "key"),
        ("auth", "key"),
        ("service", "key"),  # PagerDuty (notify/pagerduty/config.go)
        ("routing", "key"),  # PagerDuty Events v2
        ("integration", "key"),
        ("user", "key"),  # Pushover (notify/pushover/config.go)
        ("certificate", "key"),  # OAuth2 client_certificate_key (prometheus/common http_config.go)
        ("encryption", "key"),
        ("signing", "key"),
        ("license", "key"),
    }
)
# URLs that carry their credential in the path: secret although "url" ends the name.
_SECRET_URL_SEQUENCES = frozenset(
    {
        ("webhook", "url"),
        ("webhook", "uri"),
        ("hook", "url"),
        ("slack", "api", "url"),  # Alertmanager's global slack_api_url (a SecretURL)
    }
)
# Names secret as a whole, whatever their words: Alertmanager's Slack ``api_url`` (a SecretURL,
# config/notifiers.go; a bare ``api_url`` elsewhere is masked too, as it cannot be told apart in
# an inventory) and prometheus/common's ``proxy_connect_header`` (a map of Secret lists).
_SECRET_NAMES = frozenset({"api_url", "proxy_connect_header"})
# Last words that make a name a reference to a secret (a path, a file), not the secret itself:
# Alertmanager's ``*_file`` fields (``api_url_file``, ``auth_password_file``...) are the files
# its secrets are read from.
_REFERENCE_SUFFIXES = frozenset(
    {"file", "files", "path", "paths", "dir", "filename", "directory"}
    | {"yml", "yaml", "json", "j2", "conf", "cfg", "ini", "txt"}  # secret.yml: a file's name
)
# Last words that make a name a setting about a secret, not the secret: DeepOps'
# ``ssh_server_password_login: true``, sshd's PasswordAuthentication, ``token_ttl``,
# ``secret_name`` (the name of a Kubernetes Secret), Alertmanager's ``webhook_configs``, and
# URLs (``token_url`` is OAuth2's public endpoint) other than the ones above.
_SETTING_SUFFIXES = frozenset(
    {
        "login",
        "authentication",
        "enabled",
        "enable",
        "disabled",
        "required",
        "length",
        "policy",
        "ttl",
        "expiry",
        "expires",
        "expiration",
        "lifetime",
        "timeout",
        "age",
        "rotation",
        "rounds",
        "algorithm",
        "type",
        "mode",
        "method",
        "format",
        "name",
        "names",
        "config",
        "configs",
        "prompt",
        "hint",
        "retries",
        "attempts",
        "min",
        "max",
        "days",
        "interval",
        "strength",
        "complexity",
        "url",
        "uri",
        "urls",
        "endpoint",
    }
)

# The fields Alertmanager types as secrets (commoncfg.Secret, SecretURL, SecretTemplateURL), which
# its own /api/v2/status shows as <secret>: (place, field, source). "*" is anywhere (the name
# alone makes it secret); otherwise the field is secret under an ancestor whose name has that
# word or is that name. Sources: prometheus/alertmanager@68fb2d5759b3a92c0bb2a1a13d4ef7ff5b06256d,
# prometheus/common@d2417e2cbb82c4c81e4d28d55f354058169a9f08 (the HTTP client config every
# receiver embeds as http_config), prometheus/sigv4@a578e29b72909513368387439a39feb467514146.
# Every one of them has a ``*_file`` twin, which is not a secret.
ALERTMANAGER_SECRET_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("*", "smtp_auth_password", "alertmanager config/config.go:847"),
    ("*", "smtp_auth_secret", "alertmanager config/config.go:849"),
    ("*", "slack_api_url", "alertmanager config/config.go:855"),
    ("*", "slack_app_token", "alertmanager config/config.go:857"),
    ("*", "opsgenie_api_key", "alertmanager config/config.go:862"),
    ("*", "wechat_api_secret", "alertmanager config/config.go:865"),
    ("*", "victorops_api_key", "alertmanager config/config.go:869"),
    ("*", "telegram_bot_token", "alertmanager config/config.go:872"),
    ("*", "rocketchat_token", "alertmanager config/config.go:876"),
    ("*", "rocketchat_token_id", "alertmanager config/config.go:878"),
    ("*", "mattermost_webhook_url", "alertmanager config/config.go:880"),
    ("*", "auth_password", "alertmanager config/notifiers.go:132 (email_configs)"),
    ("*", "auth_secret", "alertmanager config/notifiers.go:134 (email_configs)"),
    ("*", "api_url", "alertmanager config/notifiers.go:283 (slack_configs)"),
    ("*", "app_token", "alertmanager config/notifiers.go:285 (slack_configs)"),
    ("*", "api_secret", "alertmanager config/notifiers.go:352 (wechat_configs)"),
    ("*", "api_key", "alertmanager config/notifiers.go:397 (victorops_configs)"),
    ("*", "api_key", "alertmanager notify/opsgenie/config.go:46"),
    ("*", "service_key", "alertmanager notify/pagerduty/config.go:51"),
    ("*", "routing_key", "alertmanager notify/pagerduty/config.go:53"),
    ("*", "user_key", "alertmanager notify/pushover/config.go:58"),
    ("*", "token", "alertmanager notify/pushover/config.go:60"),
    ("*", "token_id", "alertmanager notify/rocketchat/config.go:67"),
    ("*", "token", "alertmanager notify/rocketchat/config.go:69"),
    ("*", "bot_token", "alertmanager notify/telegram/config.go:40"),
    ("*", "alert_source_token", "alertmanager notify/incidentio/config.go:43"),
    ("*", "webhook_url", "alertmanager notify/discord/config.go:38"),
    ("*", "webhook_url", "alertmanager notify/mattermost/config.go:97"),
    ("*", "webhook_url", "alertmanager notify/msteams/config.go:36"),
    ("*", "webhook_url", "alertmanager notify/msteamsv2/config.go:35"),
    ("webhook", "url", "alertmanager notify/webhook/config.go:39 (webhook_configs)"),
    ("webhook", "url", "alertmanager eventrecorder/webhook.go:40 (webhook_outputs)"),
    ("*", "password", "common config/http_config.go:144 (basic_auth)"),
    ("*", "credentials", "common config/http_config.go:162 (authorization)"),
    ("*", "client_secret", "common config/http_config.go:243 (oauth2)"),
    ("*", "client_certificate_key", "common config/http_config.go:249 (oauth2)"),
    ("*", "bearer_token", "common config/http_config.go:342"),
    ("tls_config", "key", "common config/http_config.go:1330 (tls_config)"),
    ("*", "proxy_connect_header", "common config/http_config.go:1688 (ProxyHeader, config.go:63)"),
    ("*", "secrets", "common config/headers.go:85 (http_headers)"),
    ("*", "secret_key", "sigv4 sigv4_config.go:28 (sns_configs sigv4)"),
)
# Fields secret only in their place: field -> the ancestor (a word of its name, or its name).
_SECRET_IN_PLACE: dict[str, frozenset[str]] = {}
for _place, _field, _source in ALERTMANAGER_SECRET_FIELDS:
    if _place != "*":
        _SECRET_IN_PLACE[_field] = _SECRET_IN_PLACE.get(_field, frozenset()) | {_place}

_PEM_PRIVATE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY( BLOCK)?-----.*?(-----END \1PRIVATE KEY( BLOCK)?-----|\Z)",
    re.DOTALL,
)
# scheme://user:password@ and, for http(s), scheme://token@ (GitHub and others take a token as
# the user); ssh://git@host names a user only.
_URL_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s'\"]*):(?P<pw>[^@/\s'\"]+)@"
)
_HTTP_TOKEN_USER = re.compile(r"(?P<scheme>https?://)(?P<user>[^:/@\s'\"]{16,})@", re.I)
# Webhook URLs whose path is the credential: everything after the prefix is masked.
_WEBHOOK_URL = re.compile(
    r"(?P<prefix>https?://(?:"
    r"hooks\.slack\.com/(?:services|workflows|triggers)/"
    r"|(?:[\w-]+\.)?discord(?:app)?\.com/api/webhooks/"
    r"|[\w.-]*webhook\.office\.com/"
    r"|outlook\.office(?:365)?\.com/webhook/"
    r"|api\.telegram\.org/bot"
    r"|events\.pagerduty\.com/integration/"
    r"|[\w.-]+(?::\d+)?/hooks/"  # Mattermost, Rocket.Chat, Gitea... incoming webhooks
    r"))(?P<token>[^\s'\"<>]+)",
    re.I,
)
# Query parameters that carry a credential (signed URLs: Teams workflows' sig, Google Chat's key).
_QUERY_SECRET = re.compile(
    r"(?P<lead>[?&](?:sig|signature|key|token|access_token|api_key|apikey|code|auth)=)"
    r"(?P<value>[^&\s'\"#]+)",
    re.I,
)
_AUTH_HEADER = re.compile(
    r"(?P<lead>\b(?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|token|digest)\s+)?)"
    r"(?P<value>[^\s'\",;]+)",
    re.I,
)
# name=value, name: value, "name": "value", --name=value (shell, INI, YAML, JSON, repr); only a
# secret name's value is then read (a plain name's value may hold the next name).
_NAME_SEP = re.compile(
    r"(?<![\w./\\-])(?P<quote>[\"']?)(?P<key>-{0,2}[A-Za-z_][\w.-]*)(?P=quote)"
    r"(?P<sep>=(?=\S)|[ \t]*=[ \t]+|[ \t]*:(?!//)[ \t]*)"
)
# After name=value (shell, -e, INI without spaces) the value ends at a space; after name: value
# and name = value (YAML, JSON, INI) it runs to the end of its phrase.
_WORD_VALUE = re.compile(r"\"[^\"\n]*\"?|'[^'\n]*'?|[^\s\"']+")
_PHRASE_VALUE = re.compile(
    r"\"[^\"\n]*\"?|'[^'\n]*'?|[^\s\"',}\]#]+(?:[ \t]+[^\s\"',}\]#=:]+(?![=:\w]))*"
)
# A cheap test before the assignment pattern: without one of these stems no name is secret.
_SECRET_STEM = re.compile(
    r"pass|pw|secret|token|key|webhook|credential|bearer|psk|api_url|proxy_connect", re.I
)
_LITERALS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "none", "~", MASK})


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[_\-.\s]+", spaced.lower()) if w]


def _has_sequence(words: list[str], sequences: frozenset[tuple[str, ...]]) -> bool:
    for seq in sequences:
        n = len(seq)
        if any(tuple(words[i : i + n]) == seq for i in range(len(words) - n + 1)):
            return True
    return False


def is_secret_key(name: Any, parents: Iterable[Any] = ()) -> bool:
    """True when a variable (or nested key) named ``name`` holds a secret value.

    ``parents`` are the names of the mappings above it, outermost first (list positions left
    out): ``url`` is secret under ``webhook_configs``, ``key`` under ``tls_config``.
    ``smtp_password``, ``ansible_become_pass``, ``grafana_api_key``, ``slack_webhook_url`` and
    ``tls_private_key`` are secrets; ``ansible_ssh_private_key_file`` and ``vault_password_file``
    are paths to secrets, and ``ssh_server_password_login`` a setting about one: not secrets.
    """
    if not isinstance(name, str):
        return False
    if _is_secret_name(name):
        return True
    places = _SECRET_IN_PLACE.get(name)
    if places:
        for parent in parents:
            if isinstance(parent, str) and _names_place(parent, places):
                return True
    return False


@functools.lru_cache(maxsize=4096)
def _names_place(parent: str, places: frozenset[str]) -> bool:
    return parent in places or any(w in places for w in _words(parent))


# Pure in the name, and the same few names recur on every host of an inventory: judging each
# again was a large part of loading a big inventory (bench/README.md).
@functools.lru_cache(maxsize=16384)
def _is_secret_name(name: str) -> bool:
    if name.lower() in _SECRET_NAMES:
        return True
    words = _words(name)
    if not words or words[-1] in _REFERENCE_SUFFIXES:
        return False
    if _has_sequence(words, _SECRET_URL_SEQUENCES):
        return True
    if words[-1] in _SETTING_SUFFIXES:
        return False
    return any(w in _SECRET_WORDS for w in words) or _has_sequence(words, _SECRET_SEQUENCES)


_PATH_PART = re.compile(r"\[[^\]]*\]|\.")


def is_secret_path(path: str) -> bool:
    """True when a dotted key path (``alertmanager_receivers[0].slack_configs[0].api_url``, as
    errors name keys) leads through or to a secret name."""
    names = [p for p in _PATH_PART.split(path) if p]
    return any(is_secret_key(name, names[:i]) for i, name in enumerate(names))


class SecretValues:
    """Values known to be secret in this run, masked as substrings of free text.

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
        if len(text) < MIN_REGISTERED_LENGTH or text.lower() in _LITERALS:
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


def _mask_assignments(text: str) -> str:
    out: list[str] = []
    pos = 0
    for m in _NAME_SEP.finditer(text):
        if m.start() < pos or not is_secret_key(m["key"]):
            continue
        value = (_WORD_VALUE if m["sep"] == "=" else _PHRASE_VALUE).match(text, m.end())
        if value is None:
            continue
        raw = value[0]
        bare = raw.strip("\"'")
        if not bare or bare.lower() in _LITERALS:
            continue
        quote = raw[0] if raw[0] in "\"'" else ""
        closing = quote if quote and len(raw) > 1 and raw.endswith(quote) else ""
        out += [text[pos : m.end()], quote, MASK, closing]
        pos = value.end()
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def mask_content(text: str) -> str:
    """``text`` with the secrets its content shows masked, whatever their value: PEM private keys,
    URL userinfo, webhook tokens, secret query parameters, Authorization headers and
    ``name=value`` / ``name: value`` pairs whose name is secret. Registered values are not
    looked for (that is :func:`mask_text`)."""
    if "PRIVATE KEY" in text:
        text = _PEM_PRIVATE.sub(MASK, text)
    if "://" in text:
        if "@" in text:
            text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
            text = _HTTP_TOKEN_USER.sub(lambda m: f"{m['scheme']}{MASK}@", text)
        text = _WEBHOOK_URL.sub(lambda m: f"{m['prefix']}{MASK}", text)
    if "?" in text or "&" in text:
        text = _QUERY_SECRET.sub(lambda m: f"{m['lead']}{MASK}", text)
    if ("=" in text or ":" in text) and _SECRET_STEM.search(text):
        text = _mask_assignments(text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_HEADER.sub(lambda m: f"{m['lead']}{MASK}", text)
    return text


def mask_text(text: str, secrets: SecretValues | None = None) -> str:
    """Free ``text`` (an error, command output, a diff) with secrets masked: the registered values
    (``secrets``, by default :data:`REGISTERED`) wherever they appear, and everything
    :func:`mask_content` masks."""
    text = (REGISTERED if secrets is None else secrets).replace_in(text)
    return mask_content(text)


def _is_shown(value: Any) -> bool:
    """A value under a secret name that is shown anyway: unset, or a boolean (reveals nothing)."""
    return value is None or value == "" or isinstance(value, bool)


def mask(value: Any, *, parents: tuple[str, ...] = ()) -> Any:
    """A copy of ``value`` (any tree of mappings, lists and scalars) with its secrets masked, by
    name and place (:func:`is_secret_key`) and by content (:func:`mask_content`), never by
    comparing values with the registered ones.

    Values under a secret name become MASK whole (a secret name holding a mapping or a list is
    masked whole too); an unset (None or empty) or boolean one stays visible.
    """
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if is_secret_key(key, parents) and not _is_shown(item):
                out[key] = MASK
            else:
                out[key] = mask(item, parents=(*parents, key) if isinstance(key, str) else parents)
        return out
    if isinstance(value, list | tuple):
        return [mask(item, parents=parents) for item in value]
    if isinstance(value, str):
        return mask_content(value)
    return value


def secret_values_in(value: Any, *, parents: tuple[str, ...] = ()) -> list[Any]:
    """Every value stored under a secret name anywhere in ``value`` (for registering them)."""
    found: list[Any] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if is_secret_key(key, parents) and not _is_shown(item):
                found.append(item)
            else:
                inner = (*parents, key) if isinstance(key, str) else parents
                found.extend(secret_values_in(item, parents=inner))
    elif isinstance(value, list | tuple):
        for item in value:
            found.extend(secret_values_in(item, parents=parents))
    return found
