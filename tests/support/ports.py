"""Ports for daemons a test restarts on the ports they had.

A port bound with port 0 comes from the kernel's ephemeral range, which is also where every
outgoing connection's local port comes from: while a daemon is down for a restart, some other
test's connection can take its port, and the restart fails with "address already in use".
`restartable_port` picks a free port below that range instead, where only an explicit bind
can land. A port is chosen once per test process (a daemon's TCP, HTTP and RPC ports are
drawn before any is bound, so the probe alone cannot tell them apart), and each pytest-xdist
worker draws from a share of the band of its own, so two workers never choose the same one.

Daemons on documented fixed ports (`make run-cluster`'s, moved by `--port-offset`) restart on
them too: `port_offset` puts them below the ephemeral range as well, in a band of their own
above `restartable_port`'s, so neither kind can take the other's port while it is down.
`with_addresses` puts a test's own addresses into a documented snippet in place of the fixed
ones.
"""

import os
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


_handed_out: set[int] = set()


def _worker_share(lowest: int, stop: int) -> range:
    """This process's share of [lowest, stop): all of it, or one xdist worker's slice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)
    index = int(worker[2:]) % count if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (stop - lowest) // count
    return range(lowest + index * width, lowest + (index + 1) * width)


def restartable_port() -> int:
    """A TCP port on 127.0.0.1, free a moment ago and not handed out before by this process,
    that the kernel never hands out by itself."""
    share = _worker_share(LOWEST, SPLIT)
    for _ in range(200):
        port = random.choice(share)
        if port not in _handed_out and _free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port between {share.start} and {share.stop - 1}")


def port_offset(ports: set[int], step: int = 100) -> int:
    """An offset (a multiple of `step`) that moves every one of `ports` onto a port of
    127.0.0.1 that is free now, in this process's share of [SPLIT, the ephemeral range)."""
    share = _worker_share(SPLIT, _ephemeral_start())
    lowest = -(-(share.start - min(ports)) // step) * step
    highest = share.stop - 1 - max(ports)
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
