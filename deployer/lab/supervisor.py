"""The small detached process that keeps one lab host running: it runs systemd-nspawn and starts
it again whenever it exits with status 133 (the container asked for a reboot).

Run as ``python -m deployer.lab.supervisor HOST_DIR CGROUP -- systemd-nspawn ARGS...``; it first
moves itself into its own cgroup ``CGROUP`` (see ``deployer.lab.cgroups``).  It records the
current nspawn PID in ``HOST_DIR/nspawn.pid`` and its boots in ``HOST_DIR/boots``.  SIGTERM is
passed on to nspawn (which powers the container off) and then the supervisor exits.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from deployer.lab import cgroups, procs
from deployer.lab.paths import write_atomic

REBOOT_STATUS = 133
MAX_BOOTS = 500
# Boots that end within this many seconds count towards a crash loop.
QUICK_EXIT_S = 3.0
MAX_QUICK_EXITS = 5


def supervise(host_dir: Path, cgroup: str, argv: list[str]) -> int:
    cgroups.enter(cgroup)
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    quick_exits = 0
    status = 0
    try:  # a host powered on again after a power-off keeps counting its boots
        previous = int((host_dir / "boots").read_text())
    except (FileNotFoundError, ValueError):
        previous = 0
    for boot in range(previous + 1, previous + MAX_BOOTS + 1):
        if stopping:
            break
        started = time.monotonic()
        with open(host_dir / "console.log", "ab") as console:
            console.write(f"\n=== gpumon lab: boot {boot} ===\n".encode())
            console.flush()
            child = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT
            )
            procs.save(host_dir / "nspawn.pid", procs.track(child.pid))
            write_atomic(host_dir / "boots", f"{boot}\n")
            status = child.wait()
        (host_dir / "nspawn.pid").unlink(missing_ok=True)
        write_atomic(host_dir / "last-exit", f"{status}\n")
        if stopping or status != REBOOT_STATUS:
            break
        quick_exits = quick_exits + 1 if time.monotonic() - started < QUICK_EXIT_S else 0
        if quick_exits >= MAX_QUICK_EXITS:
            break
    return 0 if stopping else status


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 4 or args[2] != "--":
        print(
            "usage: python -m deployer.lab.supervisor HOST_DIR CGROUP -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    return supervise(Path(args[0]), args[1], args[3:])


if __name__ == "__main__":
    sys.exit(main())
