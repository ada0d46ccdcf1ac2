"""Error types shared by the engine: bad input (exit 2) versus faults on hosts."""

from __future__ import annotations


class InputError(Exception):
    """Bad input found before any host was contacted: the CLI exits 2 and touches nothing.

    ``source`` is the file (or ``-e``/flag) the bad value came from; ``line`` is 1-based when
    known; ``key`` is the dotted key or name at fault.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.line = line
        self.key = key

    def __str__(self) -> str:
        where = ""
        if self.source:
            where = str(self.source)
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"


class PlanRefused(InputError):
    """A version plan that the compatibility matrix refuses (exit 2, nothing touched)."""


class HostUnreachable(Exception):
    """The host could not be reached over SSH (after bounded retries)."""


class HostKeyRefused(HostUnreachable):
    """The host's SSH key is unknown or differs from known_hosts; never silently accepted."""
