"""pytest fixtures with a real nsqd and nsqlookupd, registered as the `nsqpy` pytest11 plugin.

Installed with nsqpy, so any project's tests can ask for them:

* `nsqd`: an nsqd on 127.0.0.1 ephemeral ports with its data in the test's `tmp_path`;
  a handle with `.tcp_address`, `.http_address`, `.data_path`.
* `nsqlookupd`: an nsqlookupd likewise (`.tcp_address`, `.http_address`).
* `nsq_cluster`: an nsqlookupd and an nsqd registered with it (`.nsqd`, `.nsqlookupd`,
  `.nsqd_tcp_address`, `.lookupd_http_address`); the nsqd has reached the lookupd before the
  test starts.

Each server runs on its own trio loop in a background thread, so tests in any style (plain,
threads, asyncio, trio) can use them; each is shut down cleanly after the test. Imports of
the daemons happen inside the fixtures, so loading the plugin costs nothing.
"""

import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = ["NSQCluster", "nsq_cluster", "nsqd", "nsqlookupd"]


@dataclass
class NSQCluster:
    nsqd: Any
    nsqlookupd: Any

    @property
    def nsqd_tcp_address(self) -> str:
        return self.nsqd.tcp_address

    @property
    def nsqd_http_address(self) -> str:
        return self.nsqd.http_address

    @property
    def lookupd_tcp_address(self) -> str:
        return self.nsqlookupd.tcp_address

    @property
    def lookupd_http_address(self) -> str:
        return self.nsqlookupd.http_address


@pytest.fixture
def nsqd(tmp_path_factory):
    """A running nsqd on 127.0.0.1 ephemeral ports (`.tcp_address`, `.http_address`)."""
    from nsqpy.nsqd.embed import run_in_thread

    handle = run_in_thread(data_path=str(tmp_path_factory.mktemp("nsqd")))
    yield handle
    handle.stop()


@pytest.fixture
def nsqlookupd():
    """A running nsqlookupd on 127.0.0.1 ephemeral ports (`.tcp_address`, `.http_address`)."""
    from nsqpy.nsqlookupd.embed import run_in_thread

    handle = run_in_thread()
    yield handle
    handle.stop()


@pytest.fixture
def nsq_cluster(nsqlookupd, tmp_path_factory):
    """An nsqlookupd and an nsqd registered with it (`.nsqd_tcp_address`,
    `.lookupd_http_address`, ...)."""
    from nsqpy.nsqd.embed import run_in_thread

    handle = run_in_thread(
        data_path=str(tmp_path_factory.mktemp("nsqd")),
        lookupd_tcp_address=[nsqlookupd.tcp_address],
    )
    try:
        _wait_for_registration(nsqlookupd.http_address, handle.tcp_address)
        yield NSQCluster(nsqd=handle, nsqlookupd=nsqlookupd)
    finally:
        handle.stop()


def _wait_for_registration(lookupd_http: str, nsqd_tcp: str, timeout: float = 10.0) -> None:
    """Poll lookupd's /nodes until the nsqd listening on `nsqd_tcp` appears."""
    port = int(nsqd_tcp.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(
            f"http://{lookupd_http}/nodes",
            headers={"Accept": "application/vnd.nsq; version=1.0"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            nodes = json.load(response).get("producers") or []
        if any(node.get("tcp_port") == port for node in nodes):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nsqd {nsqd_tcp} did not register with lookupd {lookupd_http}")
        time.sleep(0.01)
