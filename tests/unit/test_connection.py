"""Connection set-up: bounded retries of transient errors, host-key refusals with ssh-keygen's
fingerprints, one line in words for a host that does not speak SSH (no library traceback),
become wrapping, the pool. Servers are real, on loopback: TCP listeners and paramiko's SSH server.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from deployer import connection, known_hosts, library_logs
from deployer.connection import (
    ConnectionPool,
    SSHConnection,
    SSHTarget,
    fingerprint,
    sudo_wrap,
)
from deployer.errors import HostKeyRefused, HostUnreachable


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused at once
    return port


def stop_serving(sock: socket.socket, thread: threading.Thread) -> None:
    """Stop a server's accept loop before its socket's descriptor is freed: a loop still in
    accept() on a closed socket's number took the next test's connections when that number was
    reused for the next server's socket (a server with another host key answered them)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it (Linux)
    thread.join(timeout=10)
    sock.close()


class Listener:
    """A loopback TCP server that accepts and then, per ``behaviour``: stays silent ("silent"),
    closes at once ("close"), answers like an HTTP server and closes ("http"), or sends lines
    that are not an SSH banner and stays ("junk")."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.behaviour == "close":
                conn.close()
            elif self.behaviour == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                conn.close()
            elif self.behaviour == "junk":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n" * 120)
                self._held.append(conn)
            else:
                self._held.append(conn)

    def close(self) -> None:
        stop_serving(self.sock, self._thread)
        for c in self._held:
            c.close()


@pytest.fixture
def listener() -> Iterator[type[Listener]]:
    made: list[Listener] = []

    def make(behaviour: str) -> Listener:
        made.append(Listener(behaviour))
        return made[-1]

    yield make  # type: ignore[misc]
    for item in made:
        item.close()


@pytest.fixture
def quick(monkeypatch) -> None:
    """Short banner timeout and retry waits, so a silent host costs a second, not ten."""
    monkeypatch.setattr(connection, "CONNECT_TIMEOUT", 1.0)


def keygen(path: Path, kind: str = "ed25519") -> Path:
    bits = ["-b", "1024"] if kind == "rsa" else []  # small: only its fingerprint is used
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, *bits, "-N", "", "-C", "test", "-f", str(path)],
        check=True,
    )
    return path


def ssh_keygen_fingerprint(pub: Path) -> str:
    """The fingerprint field of ``ssh-keygen -lf``: ``256 SHA256:... comment (ED25519)``."""
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[1]


def load_key(path: Path) -> paramiko.PKey:
    return paramiko.PKey.from_path(path)


class _RefuseEveryone(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"


class SSHServer:
    """paramiko's SSH server on loopback with ``host_key``: enough for a client to see the key."""

    def __init__(self, host_key: paramiko.PKey) -> None:
        self.host_key = host_key
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(self.host_key)
            self._transports.append(transport)
            with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
                transport.start_server(server=self.interface())

    def interface(self) -> paramiko.ServerInterface:
        return _RefuseEveryone()

    def close(self) -> None:
        for t in self._transports:
            t.close()
        stop_serving(self.sock, self._thread)


@pytest.fixture
def ssh_server(tmp_path) -> Iterator[tuple[SSHServer, Path]]:
    key_file = keygen(tmp_path / "host_key")
    server = SSHServer(load_key(key_file))
    yield server, key_file.with_suffix(".pub")
    server.close()


# ---------------------------------------------------------------------------------- retries


def test_refused_connections_are_retried_a_bounded_number_of_times(monkeypatch):
    attempts = []
    real = socket.create_connection

    def counting(*args, **kwargs):
        attempts.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(connection.socket, "create_connection", counting)
    with pytest.raises(HostUnreachable) as exc:
        SSHConnection(SSHTarget(name="h", address="127.0.0.1", port=closed_port()))
    assert len(attempts) == 4
    assert "h: cannot reach 127.0.0.1" in str(exc.value)


# ---------------------------------------------------------------------------------- host keys


@pytest.mark.parametrize("kind", ["ed25519", "rsa", "ecdsa"])
def test_a_fingerprint_is_the_one_ssh_keygen_prints(tmp_path, kind):
    key_file = keygen(tmp_path / f"k_{kind}", kind)
    assert fingerprint(load_key(key_file)) == ssh_keygen_fingerprint(key_file.with_suffix(".pub"))


def test_a_changed_host_key_is_refused_naming_both_keys_as_ssh_keygen_does(ssh_server, tmp_path):
    server, pub = ssh_server
    other = keygen(tmp_path / "other_key")
    known = tmp_path / "known_hosts"
    kind, body = other.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{server.port} {kind} {body}\n")
    target = SSHTarget(
        name="gpu03", address="127.0.0.1", port=server.port, known_hosts_file=str(known)
    )
    with pytest.raises(HostKeyRefused) as exc:
        SSHConnection(target)
    message = str(exc.value)
    assert "does not match" in message
    assert f"ssh-ed25519 {ssh_keygen_fingerprint(pub)}" in message
    assert f"ssh-ed25519 {ssh_keygen_fingerprint(other.with_suffix('.pub'))}" in message
    assert f"ssh-keygen -R [127.0.0.1]:{server.port}" in message


def test_an_unknown_host_key_is_refused_with_its_ssh_keygen_fingerprint(ssh_server, tmp_path):
    server, pub = ssh_server
    known = tmp_path / "known_hosts"
    known.write_text("")
    target = SSHTarget(
        name="gpu04", address="127.0.0.1", port=server.port, known_hosts_file=str(known)
    )
    with pytest.raises(HostKeyRefused) as exc:
        SSHConnection(target)
    message = str(exc.value)
    assert f"is not in {known}" in message
    assert f"ssh-ed25519 {ssh_keygen_fingerprint(pub)}" in message
    assert "gpumon_host_key_policy=accept-new" in message
    assert known.read_text() == ""


def revoked_host_keys_case(ssh_server, tmp_path, lines: list[str], policy: str = "verify"):
    """Connect to the loopback server with a known_hosts of ``lines`` (``{key}``: the server's
    own key, ``{other}``: another ed25519 key, ``{host}``: its known_hosts name)."""
    server, pub = ssh_server
    own = " ".join(pub.read_text().split()[:2])
    other = " ".join(keygen(tmp_path / "other_key").with_suffix(".pub").read_text().split()[:2])
    host = f"[127.0.0.1]:{server.port}"
    known = tmp_path / "known_hosts"
    known.write_text("".join(x.format(key=own, other=other, host=host) + "\n" for x in lines))
    target = SSHTarget(name="gpu05", address="127.0.0.1", port=server.port, user="root",
                       known_hosts_file=str(known), host_key_policy=policy)  # fmt: skip
    return target, known, pub


@pytest.mark.parametrize("policy", ["verify", "accept-new"])
def test_a_revoked_host_key_is_refused_even_where_a_plain_line_records_it(
    ssh_server, tmp_path, policy
):
    """OpenSSH's ``@revoked``: a key revoked for the host is never trusted, whatever else the
    file records (openbsd/src usr.bin/ssh/hostfile.c, ``check_key_not_revoked``). paramiko
    alone would fail the whole file; the engine reading only the plain lines would trust it."""
    target, known, pub = revoked_host_keys_case(
        ssh_server, tmp_path, ["{host} {key}", "# revoked 2026-12-03", "@revoked * {key}"], policy
    )
    before = known.read_text()
    with pytest.raises(HostKeyRefused) as exc:
        SSHConnection(target)
    message = str(exc.value)
    assert message.startswith("gpu05: ")
    assert f"(ssh-ed25519 {ssh_keygen_fingerprint(pub)}) is revoked in {known} line 3" in message
    assert known.read_text() == before  # accept-new records nothing


def test_accept_new_never_records_a_revoked_key_of_a_host_it_has_not_seen(ssh_server, tmp_path):
    target, known, _ = revoked_host_keys_case(
        ssh_server, tmp_path, ["@revoked 127.0.0.1,[127.0.0.1]:* {key}"], "accept-new"
    )
    with pytest.raises(HostKeyRefused, match=r"is revoked in .* line 1 \(@revoked\)"):
        SSHConnection(target)
    assert known.read_text().count("\n") == 1


def test_a_revoked_key_is_named_revoked_where_another_key_of_its_type_is_recorded(
    ssh_server, tmp_path
):
    target, known, _ = revoked_host_keys_case(
        ssh_server, tmp_path, ["{host} {other}", "@revoked {host} {key}"]
    )
    with pytest.raises(HostKeyRefused) as exc:
        SSHConnection(target)
    assert f"is revoked in {known} line 2" in str(exc.value)
    assert "does not match" not in str(exc.value)


@pytest.mark.parametrize(
    "revoked_for",
    ["gpu99", "!{host},*", "[127.0.0.1]:1", "{other_port}"],
    ids=["another-host", "negated", "another-port", "pattern-of-another-port"],
)
def test_a_key_revoked_for_other_hosts_only_still_verifies_for_this_one(
    ssh_server, tmp_path, revoked_for
):
    server, _ = ssh_server
    pattern = revoked_for.replace("{other_port}", f"[127.0.0.1]:{server.port}?")
    target, _, _ = revoked_host_keys_case(
        ssh_server, tmp_path, ["{host} {key}", f"@revoked {pattern} {{key}}"]
    )
    # The host key is trusted: what fails is the login (the test server lets no one in).
    with pytest.raises(HostUnreachable) as exc:
        SSHConnection(target)
    assert not isinstance(exc.value, HostKeyRefused)
    assert "host key" not in str(exc.value)


def openssh_verdict(target: SSHTarget) -> str:
    """What OpenSSH's own client makes of ``target``'s known_hosts: ``revoked``, ``refused``
    (an unknown or changed key) or ``trusted`` (it went on to log in, and was turned away)."""
    err = subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={target.known_hosts_file}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "ConnectTimeout=10", "-p", str(target.port), f"root@{target.address}", "true"],
        capture_output=True, text=True, timeout=30, check=False,
    ).stderr  # fmt: skip
    if "revoked" in err.lower():
        return "revoked"
    if "Permission denied" in err:
        return "trusted"
    return "refused"


@pytest.mark.parametrize(
    "lines",
    [
        ["{host} {key}", "@revoked * {key}"],
        ["{host} {other}", "@revoked {host} {key}"],
        ["{host} {key}", "@revoked gpu99,!{host} {key}"],
        ["{host} {key}", "@revoked !{host},* {key}"],
        ["{host} {key}", "@revoked [127.0.0.1]:* {other}"],
        ["@cert-authority * {other}", "{host} {key}"],
    ],
    ids=[
        "revoked-everywhere",
        "revoked-other-recorded",
        "another-host",
        "negated",
        "another-key",
        "ca-line-beside",
    ],
)
def test_the_engine_judges_revoked_keys_as_openssh_s_client_does(ssh_server, tmp_path, lines):
    target, _, _ = revoked_host_keys_case(ssh_server, tmp_path, lines)
    want = openssh_verdict(target)
    try:
        SSHConnection(target)
        got = "trusted"
    except HostKeyRefused as exc:
        got = "revoked" if "is revoked in" in str(exc) else "refused"
    except HostUnreachable:
        got = "trusted"
    assert got == want


@pytest.mark.parametrize(
    ("name", "hosts", "matches"),
    [
        ("10.0.0.1", "*", True),
        ("10.0.0.1", "10.0.0.?", True),
        ("10.0.0.12", "10.0.0.?", False),
        ("GPU01.Example", "gpu*.example", True),
        ("[10.0.0.1]:2222", "[10.0.0.1]:2222", True),  # brackets are literal, not a class
        ("[10.0.0.1]:2222", "[10.0.0.1]:22", False),
        ("10.0.0.1", "10.0.0.*,!10.0.0.1", False),  # a negation wins
        ("10.0.0.2", "10.0.0.*,!10.0.0.1", True),
        ("10.0.0.1", "!10.0.0.1", False),
        ("10.0.0.2", "!10.0.0.1", False),  # a negation alone matches nothing
        ("10.0.0.1", "10.0.0.10,10.0.0.1", True),
    ],
)
def test_a_known_hosts_host_field_matches_as_openssh_matches_it(name, hosts, matches):
    assert known_hosts.hosts_match(name, hosts) is matches


def test_a_hashed_revoked_line_revokes_for_the_hashed_name_only(tmp_path):
    import base64
    import hashlib
    import hmac

    pub = keygen(tmp_path / "k").with_suffix(".pub")
    kind, body = pub.read_text().split()[:2]
    salt = b"0123456789abcdefghij"
    digest = hmac.new(salt, b"10.0.0.1", hashlib.sha1).digest()
    hashed = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    index = known_hosts.KnownHosts.parse(
        f"10.0.0.1,10.0.0.2 {kind} {body}\n@revoked {hashed} {kind} {body}\n"
    )
    key = load_key(tmp_path / "k")
    assert index.revoked_line("10.0.0.1", key) == 2
    assert index.revoked_line("10.0.0.2", key) is None
    assert index.lookup("10.0.0.1") == {}  # the revoked key is no recorded key
    assert [k.get_base64() for k in index.lookup("10.0.0.2").values()] == [body]


# ---------------------------------------------------------------------------------- no SSH


def test_a_host_that_accepts_tcp_but_never_speaks_ssh_is_one_line_in_words(listener, quick, capfd):
    silent = listener("silent")
    with pytest.raises(HostUnreachable) as exc:
        SSHConnection(SSHTarget(name="gpu07", address="127.0.0.1", port=silent.port))
    message = str(exc.value)
    assert message.startswith("gpu07: ")
    assert "accepted the connection but sent no SSH banner within 1s" in message
    assert "\n" not in message
    err = capfd.readouterr().err
    assert "Traceback" not in err and "SSHException" not in err and "EOFError" not in err
    assert silent.accepted == 1  # a silent host is not retried: each try costs the timeout


def test_a_host_that_closes_before_the_banner_is_retried_then_named(listener, quick, capfd):
    closing = listener("close")
    with pytest.raises(HostUnreachable) as exc:
        SSHConnection(SSHTarget(name="gpu08", address="127.0.0.1", port=closing.port))
    assert "gpu08: " in str(exc.value)
    assert "closed it before sending an SSH banner, 4 times" in str(exc.value)
    assert "MaxStartups" in str(exc.value)
    assert closing.accepted == connection.CONNECT_ATTEMPTS
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("behaviour", ["http", "junk"])
def test_a_port_that_answers_something_else_is_named_not_ssh_once(
    listener, quick, capfd, behaviour
):
    other = listener(behaviour)
    with pytest.raises(HostUnreachable) as exc:
        SSHConnection(SSHTarget(name="gpu09", address="127.0.0.1", port=other.port))
    assert "gpu09: " in str(exc.value) and "does not speak SSH" in str(exc.value)
    assert other.accepted == 1  # another service answers the same way every time
    assert "Traceback" not in capfd.readouterr().err


def test_verbose_shows_the_librarys_details_naming_the_host(listener, quick, capfd):
    silent = listener("silent")
    library_logs.set_verbosity(1)
    try:
        with pytest.raises(HostUnreachable):
            SSHConnection(SSHTarget(name="gpu07", address="127.0.0.1", port=silent.port))
    finally:
        library_logs.set_verbosity(0)
    err = capfd.readouterr().err
    assert "paramiko gpu07: Exception (client): Error reading SSH protocol banner" in err
    assert all(line.startswith("paramiko gpu07: ") for line in err.splitlines())


# ---------------------------------------------------------------------------------- the rest


def test_sudo_wrap_is_non_interactive_and_quotes_the_command():
    wrapped = sudo_wrap("echo 'a b' > /tmp/x", "root")
    assert wrapped.startswith("sudo -n -H -u root -- sh -c ")
    assert "'\"'\"'a b'\"'\"'" in wrapped


def test_pool_opens_one_connection_per_host_and_reopens_a_closed_one():
    opened = []

    class Conn:
        def __init__(self, host):
            self.name, self.closed = host, False
            opened.append(host)

        def close(self):
            self.closed = True

    pool = ConnectionPool(Conn)
    first = pool.get("a")
    assert pool.get("a") is first and opened == ["a"]
    first.close()
    assert pool.get("a") is not first and opened == ["a", "a"]
    pool.close_all()


# ---------------------------------------------------------------------------------- client keys


class _AcceptKey(paramiko.ServerInterface):
    def __init__(self, allowed: paramiko.PKey, seen: list[str]) -> None:
        self.allowed, self.seen = allowed, seen

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.seen.append(key.get_name())
        ok = key.get_base64() == self.allowed.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED


class KeyServer(SSHServer):
    """paramiko's SSH server on loopback accepting one client key."""

    def __init__(self, host_key: paramiko.PKey, client_key: paramiko.PKey) -> None:
        self.client_key, self.seen = client_key, []
        super().__init__(host_key)

    def interface(self) -> paramiko.ServerInterface:
        return _AcceptKey(self.client_key, self.seen)


def _known(tmp_path: Path, server: SSHServer, host_key: Path) -> Path:
    """A known_hosts file recording ``host_key`` for the server's loopback port."""
    known = tmp_path / "known_hosts"
    kind, body = host_key.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{server.port} {kind} {body}\n")
    return known


def test_a_private_key_file_is_loaded_once_for_every_connection_of_the_run(tmp_path, monkeypatch):
    """paramiko loads ``key_filename`` again for each connection, each key type in turn, and an
    RSA key's load costs cryptography's validity check (150 ms for RSA-3072 here): the engine
    loads the file once per content and hands paramiko the key."""
    host = keygen(tmp_path / "host_key")
    client = keygen(tmp_path / "id_rsa", "rsa")
    server = KeyServer(load_key(host), load_key(client))
    known = _known(tmp_path, server, host)
    loads = []
    real = paramiko.PKey.from_path
    monkeypatch.setattr(paramiko.PKey, "from_path", lambda p, *a: loads.append(p) or real(p, *a))
    target = SSHTarget(
        name="h", address="127.0.0.1", port=server.port, user="root",
        private_key_file=str(client), known_hosts_file=str(known),
    )  # fmt: skip
    try:
        for _ in range(3):
            SSHConnection(target).close()
        assert len(loads) == 1 and server.seen == ["ssh-rsa"] * 3
        # A new key in the same file is read again.
        client.unlink()
        keygen(client, "rsa")
        server.client_key = real(client)
        SSHConnection(target).close()
        assert len(loads) == 2 and server.seen[-1] == "ssh-rsa"
    finally:
        server.close()


def test_an_encrypted_key_is_left_to_paramiko_and_refused_in_words(tmp_path):
    host = keygen(tmp_path / "host_key")
    client = tmp_path / "id_locked"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret-phrase", "-f", str(client)], check=True
    )
    assert connection._private_key(str(client)) is None
    server = KeyServer(load_key(host), load_key(host))
    known = _known(tmp_path, server, host)
    target = SSHTarget(
        name="h", address="127.0.0.1", port=server.port, user="root",
        private_key_file=str(client), known_hosts_file=str(known),
    )  # fmt: skip
    try:
        with pytest.raises(HostUnreachable) as exc:
            SSHConnection(target)
        assert f"failed with the key {client}" in str(exc.value)
        assert "s3cret-phrase" not in str(exc.value)
    finally:
        server.close()


# ---------------------------------------------------------------------------------- known_hosts


def test_known_hosts_are_read_as_paramiko_reads_them(tmp_path):
    """Plain and hashed names, ``[address]:port``, several names on a line, three key types for
    one host, comments, a short line: every name looks up the same
    keys as in paramiko.HostKeys (which builds every key and is O(lines^2))."""
    keys = {k: keygen(tmp_path / f"k_{k}", k).with_suffix(".pub").read_text().split()[:2]
            for k in ("ed25519", "ecdsa", "rsa")}  # fmt: skip
    lines = [
        "# a comment",
        f"10.0.0.1 {' '.join(keys['ed25519'])}",
        f"10.0.0.1 {' '.join(keys['ecdsa'])}",
        f"[10.0.0.2]:2222,gpu02 {' '.join(keys['rsa'])}",
        f"10.0.0.3\t{' '.join(keys['ecdsa'])} comment here",
        "10.0.0.5 ssh-ed25519",
        "",
        f"10.0.0.1 {' '.join(keys['rsa'])}",
    ]
    plain = tmp_path / "known_hosts"
    plain.write_text("\n".join(lines) + "\n")
    hashed = tmp_path / "known_hosts_hashed"  # ssh-keygen -H refuses a file with a bad line
    hashed.write_text("\n".join(x for x in lines if x != "10.0.0.5 ssh-ed25519") + "\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    hashed.write_text(hashed.read_text() + "10.0.0.5 ssh-ed25519\n")
    names = ["10.0.0.1", "[10.0.0.2]:2222", "gpu02", "10.0.0.3", "10.0.0.4", "10.0.0.5",
             "10.0.0.9"]  # fmt: skip
    for path in (plain, hashed):
        ours = known_hosts.KnownHosts.parse(path.read_text())
        theirs = paramiko.HostKeys(str(path))
        for name in names:
            got = {t: k.get_base64() for t, k in ours.lookup(name).items()}
            want = {t: k.get_base64() for t, k in (theirs.lookup(name) or {}).items()}
            assert got == want, (path.name, name)
    assert "|1|" in hashed.read_text() and "10.0.0.1" not in hashed.read_text()
    assert set(known_hosts.KnownHosts.parse(plain.read_text()).lookup("10.0.0.1")) == {
        "ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"
    }  # fmt: skip


def test_a_marker_line_is_ignored_where_paramiko_fails_the_whole_file(tmp_path):
    """``@cert-authority`` lines (OpenSSH's marker for a host CA): paramiko.HostKeys raises
    InvalidHostKey on them and reads nothing; they are skipped and the rest still verifies
    (paramiko 5.1's ``hostkeys.py``). ``@revoked`` is honoured: the tests below."""
    kind, body = keygen(tmp_path / "k").with_suffix(".pub").read_text().split()[:2]
    path = tmp_path / "known_hosts"
    path.write_text(f"@cert-authority *.example {kind} {body}\n10.0.0.1 {kind} {body}\n")
    with pytest.raises(paramiko.hostkeys.InvalidHostKey):
        paramiko.HostKeys(str(path))
    index = known_hosts.KnownHosts.parse(path.read_text())
    assert [k.get_base64() for k in index.lookup("10.0.0.1").values()] == [body]
    assert index.lookup("*.example") == {}
    # A key type paramiko cannot verify (a FIDO key) is no key, where paramiko raises.
    sk = "10.0.0.4 sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t\n"
    assert known_hosts.KnownHosts.parse(sk).lookup("10.0.0.4") == {}


def test_a_fleets_known_hosts_builds_no_key_but_the_hosts_looked_up(tmp_path, monkeypatch):
    pub = keygen(tmp_path / "k").with_suffix(".pub").read_text().split()[:2]
    path = tmp_path / "known_hosts"
    path.write_text("".join(f"10.1.{i // 250}.{i % 250} {' '.join(pub)}\n" for i in range(1000)))
    built = []
    real = paramiko.PKey.from_type_string
    monkeypatch.setattr(
        paramiko.PKey, "from_type_string", lambda *a, **k: built.append(a) or real(*a, **k)
    )
    index = known_hosts.read_known_hosts(path)
    assert index is not None and built == []
    assert list(index.lookup("10.1.3.7")) == ["ssh-ed25519"] and len(built) == 1
    assert known_hosts.read_known_hosts(path) is index  # read once per content


# ---------------------------------------------------------------------------------- output


class _ExitBeforeOutput(_AcceptKey):
    """Runs every command as OpenSSH's sshd may answer it: the exit status as soon as the command
    exits, then what was still in its pipe, then EOF (``eof``: False keeps the output open, as
    a process the command left running would)."""

    def __init__(self, allowed: paramiko.PKey, head: bytes, tail: bytes, eof: bool) -> None:
        super().__init__(allowed, [])
        self.head, self.tail, self.eof = head, tail, eof

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        def answer() -> None:
            channel.sendall(self.head)
            channel.sendall_stderr(b"a warning\n")
            channel.send_exit_status(0)
            threading.Event().wait(0.3)  # the rest leaves the pipe after the exit status
            channel.sendall(self.tail)
            if self.eof:
                channel.shutdown_write()
                channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


class ExecServer(KeyServer):
    def __init__(self, host_key, client_key, head=b"", tail=b"", eof=True) -> None:
        self.head, self.tail, self.eof = head, tail, eof
        super().__init__(host_key, client_key)

    def interface(self) -> paramiko.ServerInterface:
        return _ExitBeforeOutput(self.client_key, self.head, self.tail, self.eof)


def _exec_server(tmp_path: Path, **kw) -> tuple[ExecServer, SSHTarget]:
    host = keygen(tmp_path / "host_key")
    client = keygen(tmp_path / "id_ed25519")
    server = ExecServer(load_key(host), load_key(client), **kw)
    target = SSHTarget(
        name="h", address="127.0.0.1", port=server.port, user="root",
        private_key_file=str(client), known_hosts_file=str(_known(tmp_path, server, host)),
    )  # fmt: skip
    return server, target


def test_a_commands_output_after_its_exit_status_is_read_to_the_end(tmp_path):
    # Read up to the exit status only, the tail was lost with exit 0: a facts read without its
    # architecture, a dcgmi diag without its results (seen on the lab: 7 of 120 reads cut).
    head, tail = b"x" * 200_000, b"y" * 300_000 + b"\nEND\n"
    server, target = _exec_server(tmp_path, head=head, tail=tail)
    conn = SSHConnection(target)
    try:
        got = conn.run("report")
        assert got.rc == 0 and got.stdout == (head + tail).decode()
        assert got.stderr == "a warning\n"
    finally:
        conn.close()
        server.close()


def test_output_a_left_process_keeps_open_is_read_until_a_grace_after_the_exit(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(connection, "EOF_AFTER_EXIT_S", 0.5)
    server, target = _exec_server(tmp_path, head=b"started\n", tail=b"more\n", eof=False)
    conn = SSHConnection(target)
    try:
        got = conn.run("start-something &")
        assert got.rc == 0 and got.stdout == "started\nmore\n"
    finally:
        conn.close()
        server.close()
