"""Any sequence of SIGINT and SIGTERM ends in nsqd's clean shutdown, which keeps every message.

A terminal's Ctrl-C sends SIGINT, then a supervisor (or `make run`'s cluster runner) may send
SIGTERM while nsqd is still writing its memory queues: like Go's daemons, nsqd acts on the first
signal and ignores the rest until it is done.
"""

import signal
import urllib.request

import pytest

from tests.harness import DaemonProcess, start_nsqd
from tests.nsqd.support import consume_all, numbered, publish

SEQUENCES = [
    (signal.SIGINT, signal.SIGTERM),
    (signal.SIGTERM, signal.SIGINT),
    (signal.SIGINT, signal.SIGINT),
    (signal.SIGTERM, signal.SIGTERM),
    (signal.SIGINT, signal.SIGTERM, signal.SIGINT, signal.SIGTERM),
]


def _names(sequence: tuple[signal.Signals, ...]) -> str:
    return "-".join(signum.name for signum in sequence)


@pytest.mark.parametrize("sequence", SEQUENCES, ids=_names)
def test_signals_back_to_back_keep_every_acknowledged_message(tmp_path, sequence) -> None:
    daemon = start_nsqd(tmp_path)
    try:
        http = daemon.addresses["HTTP"]
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            request = urllib.request.Request(f"http://{http}{path}", b"")
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
        publish(daemon.port(), "t", numbered(50))
        for signum in sequence:
            daemon.process.send_signal(signum)
        assert daemon.process.wait(30) == 0, daemon.log
    finally:
        daemon.kill()

    restarted = start_nsqd(tmp_path)
    try:
        assert consume_all(restarted.port(), "t", "c", 50) == set(range(50))
    finally:
        restarted.kill()


DAEMON_ARGUMENTS = {
    "nsqlookupd": (["-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0"], ("TCP", "HTTP")),
    "nsqadmin": (["-http-address=127.0.0.1:0", "-nsqd-http-address=127.0.0.1:1"], ("HTTP",)),
}


@pytest.mark.parametrize("daemon_name", sorted(DAEMON_ARGUMENTS))
@pytest.mark.parametrize("sequence", SEQUENCES[:2], ids=_names)
def test_other_daemons_exit_cleanly_on_signals_back_to_back(tmp_path, daemon_name, sequence):
    args, listeners = DAEMON_ARGUMENTS[daemon_name]
    daemon = DaemonProcess(daemon_name, args, cwd=tmp_path).start(wait_for=listeners)
    try:
        for signum in sequence:
            daemon.process.send_signal(signum)
        assert daemon.process.wait(30) == 0, daemon.log
    finally:
        daemon.kill()
