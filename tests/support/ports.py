"""Ports for daemons a test restarts on the ports they had.

A port bound with port 0 comes from the kernel's ephemeral range, which is also where every
outgoing connection's local port comes from: while a daemon is down for a restart, some other
test's connection can take its port, and the restart fails with "address already in use".
`restartable_port` picks a free port below that range instead, where only an explicit bind
can land; a random choice among thousands keeps two tests from choosing the same one.
"""

import random
import socket
from pathlib import Path

LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def restartable_port() -> int:
    """A TCP port on 127.0.0.1, free a moment ago, that the kernel never hands out by itself."""
    highest = _ephemeral_start() - 1
    for _ in range(200):
        port = random.randint(LOWEST, highest)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between {LOWEST} and {highest}")
