"""SIMULATED: dcgm-exporter's ``--web-config-file`` (prometheus/exporter-toolkit's web config),
with the Python 3 standard library only (a simulated GPU host has nothing else).

The real exporter hands the file to exporter-toolkit (``web.ListenAndServe``); what is copied:

- the file is read again for every new TLS connection (the certificate and key too) and for every
  request (basic auth): web/tls_config.go ``GetConfigForClient`` and web/handler.go ``ServeHTTP``,
  prometheus/exporter-toolkit v0.8.2 (5b1eab34484ddd353986bce736cd119d863e4ff5);
- no ``tls_server_config`` at start: plain HTTP ("TLS is disabled."); a TLS server never falls
  back to HTTP, and a client that does not trust its certificate fails the handshake;
- ``basic_auth_users``: user -> bcrypt hash; a request without them or with a wrong password gets
  401, ``WWW-Authenticate: Basic`` and ``Unauthorized`` (web/handler.go lines 141-142); the hash
  is checked with the C library's crypt(3) (libxcrypt knows ``$2a$``/``$2b$``/``$2y$``), as
  golang.org/x/crypto/bcrypt does;
- ``min_version`` (TLS10-TLS13, default TLS12: tls_config.go line 81), ``client_auth_type`` and
  ``client_ca_file`` (RequireAndVerifyClientCert, VerifyClientCertIfGiven, ...).

The file is YAML; this reads JSON (valid YAML, what gpumon-deploy writes) and the block-mapping
subset of YAML that web configs use (``key: value`` nested by indentation, quoted scalars).
"""

import base64
import json
import ssl
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt  # Python 3.11's crypt(3) binding (removed in 3.13; Debian 12 ships 3.11)

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


class WebConfigError(ValueError):
    pass


def _scalar(text):
    text = text.strip()
    if not text:
        return None
    if text[0] == '"':
        return json.loads(text)
    if text[0] == "'":
        return text[1:-1].replace("''", "'")
    return text


def parse(text):
    """The web config as a dict (JSON, or YAML block mappings of scalars)."""
    stripped = text.strip()
    if not stripped:
        return {}
    if stripped.startswith("{"):
        return json.loads(stripped)
    root = {}
    stack = [(-1, root)]
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, rest = line.strip().partition(":")
        if not sep:
            raise WebConfigError(f"line {number}: not a 'key: value' line")
        while indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        key = _scalar(key)
        if rest.strip():
            parent[key] = _scalar(rest)
        else:
            parent[key] = {}
            stack.append((indent, parent[key]))
    return root


def _same(p):
    return p


def load(path, resolve=_same):
    """``resolve`` maps a path of the config to the file system (the simulator's root)."""
    with open(resolve(path), encoding="utf-8") as f:
        config = parse(f.read())
    if not isinstance(config, dict):
        raise WebConfigError("not a mapping")
    unknown = set(config) - {"tls_server_config", "http_server_config", "basic_auth_users"}
    if unknown:  # yaml.UnmarshalStrict (tls_config.go getConfig)
        raise WebConfigError(f"field {sorted(unknown)[0]} not found in type web.Config")
    return config


def tls_enabled(config):
    tls = config.get("tls_server_config") or {}
    return bool(tls.get("cert_file") or tls.get("key_file"))


def server_context(path, resolve=_same):
    """A fresh SSLContext from the file as it is now (one per connection, like the real one)."""
    config = load(path, resolve)
    tls = config.get("tls_server_config") or {}
    if not tls.get("cert_file"):
        raise WebConfigError("missing cert_file")
    if not tls.get("key_file"):
        raise WebConfigError("missing key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS.get(
        tls.get("min_version") or "TLS12", ssl.TLSVersion.TLSv1_2
    )
    if tls.get("max_version"):
        ctx.maximum_version = TLS_VERSIONS[tls["max_version"]]
    ctx.load_cert_chain(resolve(tls["cert_file"]), resolve(tls["key_file"]))
    auth = tls.get("client_auth_type") or ""
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"Invalid ClientAuth: {auth}")
    ctx.verify_mode = CLIENT_AUTH[auth]
    if tls.get("client_ca_file"):
        ctx.load_verify_locations(resolve(tls["client_ca_file"]))
    return ctx


def authorized(path, header, resolve=_same):
    """Whether a request with ``Authorization: header`` may pass (always, without users)."""
    users = load(path, resolve).get("basic_auth_users") or {}
    if not users:
        return True
    if not header or not header.startswith("Basic "):
        return False
    try:
        user, _, password = base64.b64decode(header[6:]).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    hashed = users.get(user)
    if not hashed:
        return False
    try:
        return crypt.crypt(password, hashed) == hashed
    except (OSError, ValueError):
        return False
