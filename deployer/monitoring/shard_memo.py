"""The shard assignment of a large tier, remembered on the controller between runs.

Rendezvous hashing (deployer/monitoring/shards.py) is a pure function of the shard names and a
host's key, so what it gave once it gives on every run: 100,000 hosts in 56 shards is 5.6 million
blake2b digests, about 1.6 s of every planning (bench/README.md, round eleven). The assignment of
an inventory that large is therefore kept in one file per set of shard names, and a run hashes
only the keys the file does not hold (hosts added since). The file cannot go stale (a host's
shard under the same names never changes), only be lost or damaged; one edited and still valid
is taken as it is, like the shard layout record beside it (both are the controller's own state):

- it is read only when it is this format, names the same shards, and each key's shard is one of
  them; anything else is ignored (and replaced), never an error: the hashing gives the same;
- it is written like the controller's other state (0600, atomically, in the shard record
  directory, ``handoff.record_dir()``, under ``assignments/``), and only when a run hashed keys
  it did not hold; a directory it cannot write costs that run the hashing, nothing else;
- below ``MIN_PAIRS`` (keys x shards) nothing is read or written: hashing is quicker than the file.

The file holds host names and shard names, no secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from deployer.controller_secrets import write_private
from deployer.monitoring import handoff

#: the pure assignment remembered (``shards.assign``): keys and sorted shard names -> key's shard
Compute = Callable[[list[str], list[str]], dict[str, str]]

FORMAT = "gpumon-shard-assignment/1 rendezvous-blake2b-8"
#: keys x shards from which the assignment is remembered: 1,000,000 digests is about 0.3 s
MIN_PAIRS = 1_000_000
#: the most a file may hold, in keys per key of the run (hosts removed since are dropped then)
KEEP_FACTOR = 2
_READ_LIMIT = 256 << 20
# One writer at a time in this process (the temporary file is named by the process): a second
# caller then finds the first one's file and hashes nothing.
_LOCK = threading.Lock()


def path_for(names: Sequence[str]) -> Path:
    """The file of one set of shard names."""
    digest = hashlib.sha256("\0".join([FORMAT, *names]).encode()).hexdigest()[:24]
    return handoff.record_dir() / "assignments" / f"{digest}.json"


def read(path: Path, names: Sequence[str]) -> dict[str, int]:
    """key -> index in ``names`` from the file; empty when it is absent, of another format or
    other shards, or damaged."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_READ_LIMIT + 1)
        data = json.loads(raw) if len(raw) <= _READ_LIMIT else None
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    if data.get("shards") != list(names):
        return {}
    keys, index = data.get("keys"), data.get("shard")
    if not isinstance(keys, list) or not isinstance(index, list) or len(keys) != len(index):
        return {}
    top = len(names)
    if not all(type(i) is int and 0 <= i < top for i in index):
        return {}
    if not all(type(k) is str for k in keys):
        return {}
    return dict(zip(keys, index, strict=True))


def write(path: Path, names: Sequence[str], known: dict[str, int]) -> None:
    data = {"format": FORMAT, "shards": list(names), "keys": list(known),
            "shard": list(known.values())}  # fmt: skip
    # A directory that cannot be written: the next run hashes again (the same assignment, a
    # second or so later).
    with contextlib.suppress(OSError):
        write_private(path, json.dumps(data, separators=(",", ":")).encode(), 0o600)


def assign(keys: Sequence[str], shard_names: Sequence[str], compute: Compute) -> dict[str, str]:
    """``compute`` (``shards.assign``), remembered between runs for inputs of ``MIN_PAIRS``
    and more."""
    names = sorted(set(shard_names))
    unique = list(dict.fromkeys(keys))
    if len(names) < 2 or len(unique) * len(names) < MIN_PAIRS:
        return compute(unique, names)
    path = path_for(names)
    with _LOCK:
        known = read(path, names)
        missing = [k for k in unique if k not in known]
        if missing:
            position = {name: i for i, name in enumerate(names)}
            for key, shard in compute(missing, names).items():
                known[key] = position[shard]
            if len(known) > KEEP_FACTOR * len(unique):
                known = {k: known[k] for k in unique}
            write(path, names, known)
    return {k: names[known[k]] for k in unique}
