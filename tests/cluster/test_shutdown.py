"""Stopping a cluster-mode daemon never depends on etcd (docs/operations.md, "A replicated
cluster"): SIGTERM ends nsqd and nsqlookupd within a few seconds whether etcd refuses
connections, accepts them and answers nothing, or is fine; a stopped nsqd has written what it
acknowledged."""

import signal
import socket
import threading
import time

import pytest

from tests.cluster.etcd_server import free_port
from tests.harness import DaemonProcess, start_nsqlookupd
from tests.support.http import request

# A clean stop waits at most this long for etcd (the lease release), plus the daemon's own work.
STOP_BOUND = 5.0


class SilentEtcd:
    """A listener that accepts connections and never answers: etcd frozen, or a black hole."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._accepted.append(connection)

    def close(self) -> None:
        self._listener.close()
        for connection in self._accepted:
            connection.close()


# How etcd is away, and when the signal comes after the start.
CASES = [("refused", 0.2), ("silent", 2.0)]


@pytest.fixture
def unreachable_etcd(case):
    kind, _after = case
    if kind == "refused":
        yield f"http://127.0.0.1:{free_port()}"
    else:
        silent = SilentEtcd()
        yield silent.url
        silent.close()


def _stops_in_time(daemon: DaemonProcess, after: float) -> None:
    time.sleep(after)  # the point of the test: a signal that comes while etcd is away
    sent = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    try:
        status = daemon.process.wait(STOP_BOUND + 10)
    except Exception:
        daemon.kill()
        raise
    took = time.monotonic() - sent
    assert status == 0, daemon.log
    assert took < STOP_BOUND, f"{daemon.name} took {took:.1f} s to stop\n{daemon.log}"


@pytest.mark.parametrize("case", CASES, ids=["refused", "silent"])
def test_nsqd_stops_on_sigterm_while_etcd_is_unreachable(tmp_path, unreachable_etcd, case):
    nsqd = DaemonProcess(
        "nsqd",
        [
            "-tcp-address=127.0.0.1:0",
            "-http-address=127.0.0.1:0",
            "-rpc-port=127.0.0.1:0",
            "-broadcast-address=127.0.0.1",
            f"-data-path={tmp_path}",
            f"-cluster-leadership-addresses={unreachable_etcd}",
        ],
        cwd=tmp_path,
    ).start(wait_for=("TCP", "HTTP", "RPC"))
    # It serves what does not need the cluster meanwhile.
    assert request(nsqd.port("HTTP"), "GET", "/ping").body == b"OK"
    _stops_in_time(nsqd, case[1])


@pytest.mark.parametrize("case", CASES, ids=["refused", "silent"])
def test_nsqlookupd_stops_on_sigterm_while_etcd_is_unreachable(tmp_path, unreachable_etcd, case):
    lookupd = start_nsqlookupd(
        "-broadcast-address=127.0.0.1",
        f"-cluster-leadership-addresses={unreachable_etcd}",
        cwd=tmp_path,
    )
    assert request(lookupd.port("HTTP"), "GET", "/ping").body == b"OK"
    _stops_in_time(lookupd, case[1])
