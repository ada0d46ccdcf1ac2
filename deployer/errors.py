"""Error types shared by the engine: bad input (exit 2) versus faults on hosts.

Their text is masked when they are made (deployer/secrets.py): an error repeats what it was given
(an ``-e`` argument, an inventory line, a rendered value, a library's message), so whatever shows
or logs it shows no secret.
"""

from __future__ import annotations

from deployer.secrets import mask_text


class InputError(Exception):
    """Bad input found before any host was contacted: the CLI exits 2 and touches nothing.

    ``source`` is the file (or ``-e``/flag) the bad value came from; ``line`` is 1-based when
    known; ``key`` is the dotted key or name at fault. Each part is masked on its own (a secret
    key's name followed by the message is not a ``name: value`` pair).
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        message = mask_text(message)
        super().__init__(message)
        self.message = message
        self.source = mask_text(str(source)) if source is not None else None
        self.line = line
        self.key = mask_text(str(key)) if key is not None else None

    def __str__(self) -> str:
        # Masked again, part by part: a secret may have been registered since (the inventory
        # registers its secrets once it is loaded).
        where = ""
        if self.source:
            where = mask_text(self.source)
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        key = f"{mask_text(self.key)}: " if self.key else ""
        return f"{where}{key}{mask_text(self.message)}"


class RefusedOnRead(InputError):
    """Bad input found once hosts were read, read-only (their facts, a scheduler's node
    states): nothing was written, and the CLI says the hosts were only read."""

    hosts_read = True


class PlanRefused(InputError):
    """A version plan that the compatibility matrix refuses (exit 2, nothing touched)."""


class HostUnreachable(Exception):
    """The host could not be reached over SSH (after bounded retries)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(mask_text(str(message)))


class FactsUnread(Exception):
    """The host answered, but its facts script did not finish (sudo refused it, a fork failed):
    the host fails, saying why; it is neither unreachable nor a host without an OS."""

    def __init__(self, message: str = "") -> None:
        super().__init__(mask_text(str(message)))


class HostKeyRefused(HostUnreachable):
    """The host's SSH key is unknown or differs from known_hosts; never silently accepted."""
