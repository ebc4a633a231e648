"""A well-behaved producer and consumer that run through the whole fuzz campaign: every
message the producer was told `OK` about must reach the consumer, and both connections must
survive everything the fuzzers do to nsqd beside them."""

import socket
import threading
import time

from fuzz.tcp_grammar import CANARY_TOPIC
from nsqpy.common.command import MAGIC_V2, encode_mpub, encode_rdy, encode_sub
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message

CANARY_CHANNEL = "canary"
# Pacing of the producer: one batch, then this pause. It keeps the canary a steady trickle
# beside the fuzzers, not a load test of its own.
BATCH = 5
PAUSE = 0.02


class _Connection:
    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.decoder = FrameDecoder()
        self.frames: list = []
        self.sock.sendall(MAGIC_V2)

    def read_frame(self):
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("nsqd closed the canary connection")
            self.frames.extend(self.decoder.receive_data(data))
        return self.frames.pop(0)


class Canary:
    def __init__(self, port: int) -> None:
        self.port = port
        self.published: set[bytes] = set()
        self.received: set[bytes] = set()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._changed = threading.Condition()
        self.longest_gap = 0.0  # longest time between two deliveries (a figure, not a check)
        self._consumer = _Connection(port)
        self._consumer.sock.sendall(encode_sub(CANARY_TOPIC, CANARY_CHANNEL) + encode_rdy(200))
        frame = self._consumer.read_frame()
        if frame.data != b"OK":
            raise RuntimeError(f"canary SUB got {frame!r}")
        self._threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def start(self) -> "Canary":
        for thread in self._threads:
            thread.start()
        return self

    def _produce(self) -> None:
        try:
            connection = _Connection(self.port)
            batch = 0
            while not self.stop.is_set():
                bodies = [b"canary %d-%d" % (batch, n) for n in range(BATCH)]
                connection.sock.sendall(encode_mpub(CANARY_TOPIC, bodies))
                while True:
                    frame = connection.read_frame()
                    if frame.data != b"_heartbeat_":
                        break
                if frame.data != b"OK":
                    raise RuntimeError(f"canary MPUB got {frame!r}")
                with self._changed:
                    self.published.update(bodies)
                batch += 1
                self.stop.wait(PAUSE)
        except Exception as error:
            self.errors.append(f"producer: {error!r}")

    def _consume(self) -> None:
        connection = self._consumer
        last = time.monotonic()
        connection.sock.settimeout(1.0)
        try:
            while True:
                try:
                    frame = connection.read_frame()
                except TimeoutError:
                    if self.stop.is_set() and self.published <= self.received:
                        return
                    continue
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    message = decode_message(frame.data)
                    connection.sock.sendall(b"FIN " + message.id + b"\n")
                    now = time.monotonic()
                    self.longest_gap = max(self.longest_gap, now - last)
                    last = now
                    with self._changed:
                        self.received.add(message.body)
                        self._changed.notify_all()
                elif frame.data == b"_heartbeat_":
                    connection.sock.sendall(b"NOP\n")
                else:
                    raise RuntimeError(f"canary consumer got {frame!r}")
        except Exception as error:
            self.errors.append(f"consumer: {error!r}")
            with self._changed:
                self._changed.notify_all()

    def finish(self, timeout: float = 60.0) -> list[str]:
        """Stop producing, wait for the consumer to have everything; the problems found."""
        self.stop.set()
        self._threads[0].join(timeout)
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self.published <= self.received and not self.errors:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        self._threads[1].join(timeout)
        problems = list(self.errors)
        missing = self.published - self.received
        if missing:
            problems.append(f"canary: {len(missing)} of {len(self.published)} never delivered")
        if not self.published:
            problems.append("canary: nothing was published")
        return problems
