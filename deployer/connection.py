"""Connections to hosts: one small protocol (run a shell command), over SSH or scripted for tests.

The engine keeps one SSH connection per host open for the whole run; commands run as channels on
it. Become is ``sudo -n`` around the command. Host keys are verified against known_hosts unless the
inventory explicitly opts into accepting new keys; a refusal names the key by its SHA256
fingerprint, as ``ssh-keygen -lf`` prints it. A failure to connect is one HostUnreachable saying
the cause in words; paramiko's own logging is routed away from the terminal
(deployer/library_logs.py) and shown only with ``-v``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tenacity import (
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from deployer import library_logs
from deployer.errors import HostKeyRefused, HostUnreachable
from deployer.known_hosts import KnownHosts, PerContent, read_known_hosts
from deployer.spans import span


def _import_paramiko() -> Any:
    """Import paramiko without letting it import ``invoke``.

    paramiko.config imports invoke (when installed, e.g. with fabric) only to run ``Match exec``
    lines of an ssh_config, which the engine never reads; that import (invoke pulls in asyncio
    and unittest.mock) is paid by every run (bench/README.md). A later ``import invoke`` still
    works.
    """
    if "invoke" in sys.modules or "paramiko" in sys.modules:
        import paramiko as module

        return module
    sys.modules["invoke"] = None  # type: ignore[assignment]
    try:
        import paramiko as module
    finally:
        del sys.modules["invoke"]
    return module


paramiko = _import_paramiko()
library_logs.route("paramiko")


class _Transport(paramiko.Transport):
    """paramiko's transport, waking once a second instead of ten times when idle.

    Its reader thread polls the socket with this timeout only to notice that the transport was
    closed (close() marks it closed and does not wait for the thread) and to send keepalives
    (every KEEPALIVE_S). With a connection per host kept open, 200 hosts meant 2,000 wake-ups a
    second, each taking the GIL from the threads doing the work.
    """

    _active_check_timeout = 1.0


DEFAULT_COMMAND_TIMEOUT = 900.0
TRANSPORT_JOIN_S = 2.0  # a failed transport's thread ends in well under that
CONNECT_TIMEOUT = 10.0
# A host that stops answering mid-run is declared unreachable after this many seconds of
# unacknowledged traffic (TCP_USER_TIMEOUT), with keepalives making sure there is traffic.
DEAD_PEER_TIMEOUT_S = 20
KEEPALIVE_S = 5


@dataclass(frozen=True)
class CommandResult:
    """What one command returned on a host."""

    command: str
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


class CommandFailed(Exception):
    """A command the engine needed to succeed exited non-zero."""

    def __init__(self, result: CommandResult) -> None:
        err = (result.stderr or result.stdout).strip().splitlines()
        tail = err[-1] if err else ""
        super().__init__(f"command failed (rc={result.rc}): {tail}")
        self.result = result


class Connection(Protocol):
    """What modules and the executor may do on a host."""

    name: str

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult: ...

    def close(self) -> None: ...


def sudo_wrap(command: str, become_user: str = "root") -> str:
    """Wrap a shell command so it runs through non-interactive sudo as ``become_user``."""
    return f"sudo -n -H -u {shlex.quote(become_user)} -- sh -c {shlex.quote(command)}"


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to reach one host (mirrors the inventory's connection variables)."""

    name: str
    address: str
    port: int = 22
    user: str | None = None
    private_key_file: str | None = None
    become: bool = False
    become_user: str = "root"
    known_hosts_file: str | None = None
    host_key_policy: str = "verify"


def fingerprint(key: Any) -> str:
    """A public key's fingerprint as ``ssh-keygen -lf`` prints it: ``SHA256:`` and the base64 of
    the SHA-256 of the key blob, without padding (openssh-portable sshkey.c, fingerprint_b64)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


class _UnknownHostKey(paramiko.SSHException):
    """The host offered a key that known_hosts does not hold (and new keys are not accepted)."""

    def __init__(self, hostname: str, key: Any) -> None:
        super().__init__(f"host key for {hostname} is not in known_hosts")
        self.key = key


class _RevokedHostKey(paramiko.SSHException):
    """The host offered a key that a ``@revoked`` line of known_hosts names for it."""

    def __init__(self, hostname: str, key: Any, line: int) -> None:
        super().__init__(f"host key for {hostname} is revoked in known_hosts")
        self.key = key
        self.line = line


def _refuse_revoked(recorded: KnownHosts | None, hostname: str, key: paramiko.PKey) -> None:
    if recorded is not None:
        line = recorded.revoked_line(hostname, key)
        if line is not None:
            raise _RevokedHostKey(hostname, key, line)


class _RejectUnknownPolicy(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy, raising an error that carries the offered key (a revoked key
    is refused as revoked)."""

    def __init__(self, recorded: KnownHosts | None = None) -> None:
        self.recorded = recorded

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        _refuse_revoked(self.recorded, hostname, key)
        raise _UnknownHostKey(hostname, key)


class _NoBanner(Exception):
    """The host accepted TCP but sent no SSH protocol banner. ``closed``: it closed the
    connection (sshd restarting, or refusing connections past MaxStartups: worth a retry);
    otherwise it stayed silent for the banner timeout (not an SSH server, or sshd hung)."""

    def __init__(self, closed: bool) -> None:
        super().__init__("closed before the SSH banner" if closed else "no SSH banner")
        self.closed = closed


class _BannerClosed(_NoBanner):
    def __init__(self) -> None:
        super().__init__(closed=True)


class _NotSSH(Exception):
    """The host answered with something other than an SSH banner."""


def _transport_factory(host: str) -> Callable[..., Any]:
    """Transports that log on the host's own channel, so a record names its host."""

    def make(sock: Any, **kwargs: Any) -> Any:
        transport = _Transport(sock, **kwargs)
        transport.set_log_channel(library_logs.host_channel(host))
        return transport

    return make


class _ReadCounter:
    """The socket paramiko reads, counting what the server sent: a port that answered anything
    but an SSH banner is another service (an HTTP port sends an error page and closes), one that
    sent nothing before closing is an sshd turning the connection away."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.received = 0

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        self.received += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _why_no_session(exc: Exception, transport: Any, received: int) -> Exception:
    """What an SSHException raised before the session was up means, as a typed error.

    The transport holds the server's banner once it was read (``remote_version``). Without one,
    the server sent something else (``received``), or closed the connection (the transport
    thread's exception was raised handling the socket's EOF or reset), or sent nothing for the
    banner timeout; paramiko's own exception then depends on which of its timeouts fired first
    ("Error reading SSH protocol banner", "No existing session"), so it is not what decides.
    """
    if transport is None or getattr(transport, "remote_version", ""):
        return exc
    if received:
        return _NotSSH(str(exc))
    causes = (
        exc.__context__,
        getattr(getattr(transport, "saved_exception", None), "__context__", None),
    )
    if any(isinstance(cause, EOFError | ConnectionError) for cause in causes):
        return _BannerClosed()
    return _NoBanner(closed=False)


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Accept and record keys of hosts never seen before; a changed key is still refused, and
    a revoked one is never accepted."""

    def __init__(
        self, known_hosts_file: Path, lock: threading.Lock, recorded: KnownHosts | None = None
    ) -> None:
        self.known_hosts_file = known_hosts_file
        self.lock = lock
        self.recorded = recorded

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        _refuse_revoked(self.recorded, hostname, key)
        with self.lock:
            self.known_hosts_file.parent.mkdir(parents=True, exist_ok=True)
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            fd = os.open(self.known_hosts_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as fh:
                fh.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


_KNOWN_HOSTS_LOCK = threading.Lock()


def _load_private_key(path: Path) -> Any:
    try:
        return paramiko.PKey.from_path(path)
    except Exception:  # encrypted, unknown type, unreadable: paramiko's own path says why
        return None


_PRIVATE_KEYS = PerContent(_load_private_key)


def _private_key(path: str) -> Any:
    """The private key (and its ``-cert.pub`` beside it) in ``path``, loaded once per content
    and shared by every connection of the run; None when it cannot be loaded without a
    passphrase, and paramiko then loads it itself, with its own error, as before.

    Given ``key_filename``, paramiko's SSHClient loads the file again for every connection,
    trying each key type in turn, and loading an RSA key costs cryptography's validity check:
    150 ms of CPU for an RSA-3072 key on this machine (bench/README.md, "Round four"), that is
    150 CPU-seconds for 1,000 hosts.
    """
    return _PRIVATE_KEYS.get(Path(path).expanduser())


_TRANSIENT = (
    socket.timeout,
    ConnectionRefusedError,
    ConnectionResetError,
    paramiko.ssh_exception.NoValidConnectionsError,
    EOFError,
    _BannerClosed,
)
CONNECT_ATTEMPTS = 4


class SSHConnection:
    """One SSH connection to a host, kept open; each ``run`` is a channel on it."""

    def __init__(self, target: SSHTarget) -> None:
        self.target = target
        self.name = target.name
        self.closed = False
        self._client = self._connect()

    def _host_key_name(self) -> str:
        t = self.target
        return t.address if t.port == 22 else f"[{t.address}]:{t.port}"

    def _revoked(self, known: Path, key: Any, line: int) -> HostKeyRefused:
        return HostKeyRefused(
            f"{self.target.name}: host key for {self._host_key_name()} ({key.get_name()} "
            f"{fingerprint(key)}) is revoked in {known} line {line} (@revoked); refusing to "
            "connect. A revoked key is never trusted, whatever else known_hosts records: "
            "check the host out of band and give it a new host key."
        )

    def _connect(self) -> paramiko.SSHClient:
        t = self.target
        known = Path(t.known_hosts_file or Path.home() / ".ssh" / "known_hosts").expanduser()

        @retry(
            retry=retry_if_exception_type(_TRANSIENT),
            stop=stop_after_attempt(CONNECT_ATTEMPTS),
            # Jittered: hosts turned away together (sshd's MaxStartups) come back apart.
            wait=wait_random_exponential(multiplier=0.5, max=4),
            reraise=True,
        )
        def attempt() -> paramiko.SSHClient:
            client = paramiko.SSHClient()
            recorded = read_known_hosts(known)
            if recorded is not None:
                name = self._host_key_name()
                for key_type, key in (recorded.lookup(name) or {}).items():
                    client.get_host_keys().add(name, key_type, key)
            if t.host_key_policy == "accept-new":
                client.set_missing_host_key_policy(
                    _AcceptNewPolicy(known, _KNOWN_HOSTS_LOCK, recorded)
                )
            else:
                client.set_missing_host_key_policy(_RejectUnknownPolicy(recorded))
            raw = socket.create_connection((t.address, t.port), timeout=CONNECT_TIMEOUT)
            _tune_socket(raw)
            sock = _ReadCounter(raw)
            key = _private_key(t.private_key_file) if t.private_key_file else None
            try:
                client.connect(
                    t.address,
                    port=t.port,
                    username=t.user,
                    pkey=key,
                    key_filename=None if key is not None else t.private_key_file,
                    sock=sock,
                    transport_factory=_transport_factory(t.name),
                    timeout=CONNECT_TIMEOUT,
                    banner_timeout=CONNECT_TIMEOUT,
                    auth_timeout=CONNECT_TIMEOUT,
                    allow_agent=t.private_key_file is None,
                    look_for_keys=t.private_key_file is None,
                )
            except (paramiko.BadHostKeyException, paramiko.AuthenticationException):
                client.close()
                raise
            except paramiko.SSHException as exc:
                transport = client.get_transport()
                client.close()
                if transport is not None:
                    # Its thread logs why it failed (-v shows it) as it ends: let it finish, so
                    # every line of it comes before our one-line error, never after.
                    transport.join(timeout=TRANSPORT_JOIN_S)
                why = _why_no_session(exc, transport, sock.received)
                if why is exc:
                    raise
                raise why from exc
            except BaseException:
                client.close()
                raise
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(KEEPALIVE_S)
            return client

        where = f"{t.address}:{t.port}"
        try:
            return attempt()
        except _RevokedHostKey as exc:
            raise self._revoked(known, exc.key, exc.line) from exc
        except paramiko.BadHostKeyException as exc:
            recorded = read_known_hosts(known)
            line = recorded.revoked_line(self._host_key_name(), exc.key) if recorded else None
            if line is not None:  # a revoked key, where another one of its type is recorded
                raise self._revoked(known, exc.key, line) from exc
            raise HostKeyRefused(
                f"{t.name}: host key for {self._host_key_name()} ({exc.key.get_name()} "
                f"{fingerprint(exc.key)}) does not match the one recorded in {known} "
                f"({exc.expected_key.get_name()} {fingerprint(exc.expected_key)}); refusing to "
                "connect. If the host was reinstalled, check its new key out of band and remove "
                f"the old one (ssh-keygen -R {self._host_key_name()} -f {known})."
            ) from exc
        except _UnknownHostKey as exc:
            raise HostKeyRefused(
                f"{t.name}: host key for {self._host_key_name()} ({exc.key.get_name()} "
                f"{fingerprint(exc.key)}) is not in {known}; refusing to connect. Check the "
                "fingerprint out of band (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on the "
                "host) and add the key to known_hosts, or opt in to accepting new keys with "
                "gpumon_host_key_policy=accept-new."
            ) from exc
        except _NoBanner as exc:
            if exc.closed:
                raise HostUnreachable(
                    f"{t.name}: {where} accepted the connection but closed it before sending "
                    f"an SSH banner, {CONNECT_ATTEMPTS} times (sshd restarting or refusing "
                    "connections past its MaxStartups limit, or not an SSH port)"
                ) from exc
            raise HostUnreachable(
                f"{t.name}: {where} accepted the connection but sent no SSH banner within "
                f"{CONNECT_TIMEOUT:g}s (not an SSH server on this port, or sshd is hung)"
            ) from exc
        except _NotSSH as exc:
            raise HostUnreachable(
                f"{t.name}: {where} does not speak SSH: it answered with something other than "
                "an SSH banner (another service on this port?)"
            ) from exc
        except paramiko.AuthenticationException as exc:
            how = (
                f"the key {t.private_key_file}"
                if t.private_key_file
                else "the agent's and ~/.ssh's keys"
            )
            raise HostUnreachable(
                f"{t.name}: SSH authentication as {t.user or 'the current user'} on {where} "
                f"failed with {how}: {exc or type(exc).__name__}"
            ) from exc
        except paramiko.SSHException as exc:
            raise HostUnreachable(
                f"{t.name}: SSH to {where} failed: {exc or type(exc).__name__}"
            ) from exc
        except (OSError, EOFError) as exc:
            raise HostUnreachable(
                f"{t.name}: cannot reach {where}: {exc or type(exc).__name__}"
            ) from exc

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        with span("remote", self.name):
            return self._run(command, stdin, timeout)

    def _run(self, command: str, stdin: bytes | None, timeout: float | None) -> CommandResult:
        full = command
        if self.target.become and (self.target.user or "") != self.target.become_user:
            full = sudo_wrap(command, self.target.become_user)
        try:
            transport = self._client.get_transport()
            if transport is None or not transport.is_active():
                raise HostUnreachable(f"{self.name}: connection lost")
            chan = transport.open_session(timeout=CONNECT_TIMEOUT)
            chan.settimeout(timeout or DEFAULT_COMMAND_TIMEOUT)
            chan.exec_command(full)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = _drain(chan, timeout or DEFAULT_COMMAND_TIMEOUT)
            rc = chan.recv_exit_status()
            chan.close()
            if rc == -1:
                # The channel closed without an exit status: the host went away mid-command.
                raise HostUnreachable(
                    f"{self.name}: connection lost while running a command (no exit status)"
                )
        except HostUnreachable:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(
                f"{self.name}: connection lost: {exc or type(exc).__name__}"
            ) from exc
        return CommandResult(
            command=command,
            rc=rc,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
        )

    def close(self) -> None:
        self._client.close()
        self.closed = True


def _tune_socket(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_TIMEOUT_S * 1000)


#: How often a wait for output also looks at stderr and the exit status.
POLL_S = 0.05
#: After the exit status, how long the rest of the output may take to arrive. OpenSSH's sshd sends
#: the exit status as soon as the command exits, and what is still in the command's pipes after
#: it (session.c, session_exit_message: "we must not call 'chan_read_failed', since there could
#: be some more data waiting in the pipe"): the output is whole at the channel's EOF, not at the
#: exit status. A process the command left running with its output open holds the EOF back: it
#: is waited for this long after the exit status and the last byte.
EOF_AFTER_EXIT_S = 5.0


def _drain(chan: paramiko.Channel, idle_timeout_s: float) -> tuple[bytes, bytes]:
    """Read stdout and stderr until the channel's EOF, without either pipe filling up. Read up to
    the exit status only, the tail of an output was lost now and then with exit 0 (a facts read
    without its architecture, a dcgmi diag without its results). ``idle_timeout_s``: a command
    that prints nothing for that long, not yet exited, times out."""
    out: list[bytes] = []
    err: list[bytes] = []
    chan.settimeout(POLL_S)
    last = time.monotonic()
    exited_at: float | None = None
    while True:
        got = False
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))
            got = True
        try:
            data: bytes | None = chan.recv(65536)
        except TimeoutError:
            data = None
        if data == b"":  # EOF (or the channel closed): every byte of stdout is in
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
            break
        now = time.monotonic()
        if data:
            out.append(data)
            got = True
        if got:
            last = now
            continue
        if exited_at is None and chan.exit_status_ready():
            exited_at = now
        if exited_at is not None:
            if now - max(last, exited_at) >= EOF_AFTER_EXIT_S:
                break
        elif now - last >= idle_timeout_s:
            raise TimeoutError("timed out")
    return b"".join(out), b"".join(err)


@dataclass
class ScriptedConnection:
    """A connection for unit tests: answers commands from a script of (substring, result) rules.

    The first rule whose substring occurs in the command answers it; every command is recorded so
    tests can assert exactly what ran.
    """

    name: str = "scripted"
    rules: list[tuple[str, CommandResult | tuple[int, str, str]]] = field(default_factory=list)
    default: tuple[int, str, str] = (0, "", "")
    commands: list[str] = field(default_factory=list)
    stdins: list[bytes | None] = field(default_factory=list)

    def on(
        self, needle: str, rc: int = 0, stdout: str = "", stderr: str = ""
    ) -> ScriptedConnection:
        self.rules.append((needle, (rc, stdout, stderr)))
        return self

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        self.commands.append(command)
        self.stdins.append(stdin)
        for needle, answer in self.rules:
            if needle in command:
                if isinstance(answer, CommandResult):
                    return answer
                rc, out, err = answer
                return CommandResult(command, rc, out, err)
        rc, out, err = self.default
        return CommandResult(command, rc, out, err)

    def close(self) -> None:
        pass


class LocalConnection:
    """Runs commands on this machine with ``sh -c`` (engine tests and the controller itself)."""

    def __init__(self, name: str = "localhost") -> None:
        self.name = name

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        import subprocess

        proc = subprocess.run(
            ["sh", "-c", command],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=timeout or DEFAULT_COMMAND_TIMEOUT,
            check=False,
        )
        return CommandResult(
            command,
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
        )

    def close(self) -> None:
        pass


class ConnectionPool:
    """At most one open connection per host for a whole run, shared by facts and converge."""

    def __init__(self, opener: Callable[[str], Connection]) -> None:
        self._opener = opener
        self._conns: dict[str, Connection] = {}
        self._lock = threading.Lock()
        self._host_locks: dict[str, threading.Lock] = {}

    def get(self, host: str) -> Connection:
        with self._lock:
            lock = self._host_locks.setdefault(host, threading.Lock())
        with lock:
            conn = self._conns.get(host)
            if conn is None or getattr(conn, "closed", False):
                conn = self._opener(host)
                self._conns[host] = conn
            return conn

    def drop(self, host: str) -> None:
        """Close ``host``'s connection (the next ``get`` opens a new one)."""
        with self._lock:
            conn = self._conns.pop(host, None)
        if conn is not None:
            conn.close()

    def close_all(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
