"""A consumer that stops reading is cut off by the write deadline; nobody else waits for it.

Go nsqd sets a write deadline of one heartbeat interval before every flush to a client
(clientV2.Flush, protocolV2.Send); a client whose socket accepts nothing for that long is
disconnected, and the messages it had in flight time out and go to the channel's other
consumers. nsqd runs as its own process here. The slow consumer has a tiny receive buffer, a
one-second heartbeat interval and a high RDY, never reads, but keeps writing `NOP`s so its
read deadline never fires: only the write deadline can end it. Meanwhile a consumer of
another channel of the same topic receives every message at full pace.
"""

import socket
import threading
import time

from nsqpy.common.command import MAGIC_V2, NOP, encode_identify, encode_mpub, encode_rdy, encode_sub
from tests.harness import V2Connection, start_nsqd

MESSAGES = 3000
BODY_SIZE = 4096  # 12 MB in all: far more than the socket buffers of the slow consumer hold
BATCH = 100


def _body(number: int) -> bytes:
    return b"%08d" % number + b"s" * (BODY_SIZE - 8)


def _drain_until_closed(sock: socket.socket, timeout: float) -> bool:
    """Read what nsqd had sent until it closes the connection; False if it never does."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def _receive_all(port: int, channel: str, expected: set[bytes], timeout: float) -> dict:
    """Every expected body from `channel`, with the attempts of its first delivery."""
    consumer = V2Connection(port, timeout=timeout)
    try:
        consumer.send(encode_sub("t", channel) + encode_rdy(1000))
        assert consumer.read_response().data == b"OK"
        received: dict[bytes, int] = {}
        deadline = time.monotonic() + timeout
        while not expected <= received.keys():
            assert time.monotonic() < deadline, f"{len(received)} of {len(expected)} received"
            for message in consumer.read_messages(1):
                received.setdefault(message.body, message.attempts)
                consumer.send(b"FIN " + message.id + b"\n")
        return received
    finally:
        consumer.close()


def test_a_consumer_that_stops_reading_is_disconnected_without_stalling_others(tmp_path):
    daemon = start_nsqd(tmp_path)
    try:
        port = daemon.port("TCP")
        bodies = {_body(number) for number in range(MESSAGES)}

        # The fast consumer subscribes first so that both channels get every message.
        fast = V2Connection(port, timeout=30)
        fast.send(encode_sub("t", "fast"))
        assert fast.read_response().data == b"OK"

        slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", port))
        slow_address = f"127.0.0.1:{slow.getsockname()[1]}"
        slow.sendall(
            MAGIC_V2
            + encode_identify({"heartbeat_interval": 1000, "msg_timeout": 1000})
            + encode_sub("t", "slow")
            + encode_rdy(2500)
        )
        # It answers nothing it is sent, but writes a NOP four times a heartbeat interval.
        stop_nops = threading.Event()

        def keep_writing() -> None:
            while not stop_nops.wait(0.25):
                try:
                    slow.send(NOP)
                except OSError:
                    return

        nopper = threading.Thread(target=keep_writing, daemon=True)
        nopper.start()

        publisher = V2Connection(port, timeout=30)
        ordered = [_body(number) for number in range(MESSAGES)]
        fast.send(encode_rdy(1000))
        received_fast: set[bytes] = set()
        gaps: list[float] = []
        last = time.monotonic()
        for start in range(0, MESSAGES, BATCH):
            publisher.send(encode_mpub("t", ordered[start : start + BATCH]))
            assert publisher.read_response().data == b"OK"
            # The fast consumer keeps up with the publisher while the slow one is stuck.
            for message in fast.read_messages(BATCH):
                received_fast.add(message.body)
                fast.send(b"FIN " + message.id + b"\n")
                now = time.monotonic()
                gaps.append(now - last)
                last = now
        assert received_fast == bodies

        line = daemon.wait_for_log(rf"\[{slow_address}\] write deadline exceeded", timeout=30)
        stop_nops.set()
        assert _drain_until_closed(slow, timeout=30), "nsqd never closed the slow consumer"
        slow.close()
        nopper.join(5)
        # No read deadline ended it: it wrote all along.
        assert not any(
            "read deadline" in entry and slow_address in entry for entry in daemon.lines
        ), daemon.log[-3000:]

        # What the slow consumer had in flight times out and goes to the next consumer of
        # its channel, with everything it was never sent.
        rescued = _receive_all(port, "slow", bodies, timeout=60)
        assert rescued.keys() == bodies
        timed_out = sum(1 for attempts in rescued.values() if attempts > 1)
        assert timed_out > 0, "the slow consumer had nothing in flight"
        print(
            f"\n{line}\nfast consumer: {len(received_fast)} messages, max gap {max(gaps):.3f} s;"
            f" {timed_out} in flight on the slow one came back with attempts 2"
        )
        publisher.close()
        fast.close()
    finally:
        assert daemon.stop() == 0, daemon.log[-3000:]
