"""Ports for daemons a test restarts on the ports they had.

A port bound with port 0 comes from the kernel's ephemeral range, which is also where every
outgoing connection's local port comes from: while a daemon is down for a restart, some other
test's connection can take its port, and the restart fails with "address already in use".
`restartable_port` picks a free port below that range instead, where only an explicit bind
can land; a random choice among thousands keeps two tests from choosing the same one.

Daemons on documented fixed ports (`make run-cluster`'s, moved by `--port-offset`) restart on
them too: `port_offset` puts them below the ephemeral range as well, in a band of their own
above `restartable_port`'s, so neither kind can take the other's port while it is down.
`with_addresses` puts a test's own addresses into a documented snippet in place of the fixed
ones.
"""

import random
import re
import socket
from pathlib import Path

LOWEST = 10000
# restartable_port draws from [LOWEST, SPLIT); port_offset moves fixed ports into [SPLIT, the
# ephemeral range).
SPLIT = 21000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port: int) -> bool:
    """Whether a TCP port of 127.0.0.1 can be bound now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def restartable_port() -> int:
    """A TCP port on 127.0.0.1, free a moment ago, that the kernel never hands out by itself."""
    highest = SPLIT - 1
    for _ in range(200):
        port = random.randint(LOWEST, highest)
        if _free(port):
            return port
    raise RuntimeError(f"no free port between {LOWEST} and {highest}")


def port_offset(ports: set[int], step: int = 100) -> int:
    """An offset (a multiple of `step`) that moves every one of `ports` onto a port of
    127.0.0.1 that is free now, between SPLIT and the ephemeral range."""
    lowest = -(-(SPLIT - min(ports)) // step) * step
    highest = _ephemeral_start() - 1 - max(ports)
    offsets = list(range(lowest, highest + 1, step))
    random.shuffle(offsets)
    for offset in offsets:
        if all(_free(port + offset) for port in ports):
            return offset
    raise RuntimeError(f"no offset puts ports {sorted(ports)} on free ports")


def with_addresses(text: str, addresses: dict[str, str]) -> str:
    """`text` (a documented snippet) with each `127.0.0.1:<port>` that `addresses` names
    replaced, in one pass over whole addresses: replacing them one after another would
    rewrite a port an earlier replacement put in (an ephemeral 41512 starts with 4151)."""
    return re.sub(r"127\.0\.0\.1:\d+", lambda found: addresses.get(found[0], found[0]), text)
