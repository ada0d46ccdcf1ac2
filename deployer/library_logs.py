"""Where the libraries' logging goes: never straight onto the terminal, details only with ``-v``.

paramiko logs a host that accepts TCP but never speaks SSH as an error with two tracebacks from
its transport thread; with no handler configured, Python's last-resort handler printed them on
stderr before the recap. The engine reports such a failure itself, one line per host with the
cause in words (deployer/connection.py); the libraries' records are the details behind it, shown
on stderr only at ``-v`` (warnings and errors, paramiko's tracebacks included), ``-vv`` (info) and
``-vvv`` (debug), each line prefixed with the library (and the host, for paramiko), masked.
"""

from __future__ import annotations

import logging
import sys
import threading

from deployer.secrets import mask_text

# paramiko logs each connection on a channel of its own (Transport.set_log_channel), so a record
# names its host: PARAMIKO_HOST_CHANNEL + host.
PARAMIKO_HOST_CHANNEL = "paramiko.host."
_THRESHOLDS = {0: logging.CRITICAL + 1, 1: logging.WARNING, 2: logging.INFO}

_lock = threading.Lock()
_verbosity = 0
_routed: set[str] = set()
_root_routed = False


def host_channel(host: str) -> str:
    """The paramiko log channel of the connection to ``host``."""
    return PARAMIKO_HOST_CHANNEL + host


def threshold() -> int:
    """The lowest level shown at the current verbosity (above CRITICAL: nothing)."""
    return _THRESHOLDS.get(_verbosity, logging.DEBUG)


def verbosity() -> int:
    return _verbosity


def set_verbosity(level: int) -> None:
    """0: the libraries' records are dropped; 1 (-v): warnings and errors; 2: info; 3: debug."""
    global _verbosity
    with _lock:
        _verbosity = max(0, level)
        for name in _routed:
            logging.getLogger(name).setLevel(threshold())
        if _root_routed:
            logging.getLogger().setLevel(min(logging.WARNING, threshold()))


def _source(name: str) -> str:
    if name.startswith(PARAMIKO_HOST_CHANNEL):
        return f"paramiko {name[len(PARAMIKO_HOST_CHANNEL) :]}"
    if name == "py.warnings":
        return "warning"
    return name.split(".", 1)[0] or "log"


class LibraryRecords(logging.Handler):
    """Writes the records at or above :func:`threshold` to stderr, one masked line at a time."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < threshold():
            return
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            source = _source(record.name)
            lines = mask_text(text).splitlines() or [""]
            # Looked up now: on a terminal, rich's live table redirects sys.stderr.
            sys.stderr.write("".join(f"{source}: {line}\n" for line in lines))
        except Exception:
            self.handleError(record)


HANDLER = LibraryRecords(level=logging.DEBUG)


def route(name: str) -> None:
    """Route the logger ``name`` (and its children) through :data:`HANDLER` only: its records
    no longer reach the root logger or the last-resort handler."""
    with _lock:
        logger = logging.getLogger(name)
        if HANDLER not in logger.handlers:
            logger.addHandler(HANDLER)
        logger.propagate = False
        logger.setLevel(threshold())
        _routed.add(name)


def route_everything() -> None:
    """Every library's records and Python's warnings through :data:`HANDLER` (the CLI does this
    once; a library used without the CLI is routed where it is imported: paramiko, by
    deployer/connection.py)."""
    global _root_routed
    route("paramiko")
    root = logging.getLogger()
    with _lock:
        if HANDLER not in root.handlers:
            root.addHandler(HANDLER)
        root.setLevel(min(logging.WARNING, threshold()))
        _root_routed = True
    logging.captureWarnings(True)
