"""Connection set-up: bounded retries of transient errors, become wrapping, the pool."""

from __future__ import annotations

import socket

import pytest

from deployer import connection
from deployer.connection import ConnectionPool, SSHConnection, SSHTarget, sudo_wrap
from deployer.errors import HostUnreachable


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused at once
    return port


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
