"""One consumer connection to one nsqd, owned by a background thread.

The thread is the only user of the socket after the handshake: it reads whatever nsqd sent,
hands the messages of each read to the shared inbox as one chunk, answers heartbeats with NOP,
sends the FINs and REQs the reader queues, and TOUCHes every unfinished message each
msg_timeout/2 so that a batch Spark is still working on does not time out. nsqd caps TOUCH at
delivery + --max-msg-timeout, after which the message is redelivered anyway: the documented
source of duplicates for long batches.

Keeping every send on one thread keeps a FIN from interleaving with a NOP or a TOUCH. The
thread sleeps in `select` on the socket and on a wake-up socket pair, so a FIN the reader
queues goes out at once rather than after a poll interval.
"""

import queue
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TypeAlias

from nsqpy.client.blocking import Consumer, NSQError, receive_available
from nsqpy.client.security import Security
from nsqpy.common.command import NOP, encode_rdy
from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, Frame

# One delivery: (message id, body, attempts, nsqd's timestamp in ns). A plain tuple: tens of
# thousands are made per second and transposed into Arrow columns by the reader.
Delivery: TypeAlias = tuple[bytes, bytes, int, int]

# A message frame's payload: [8 timestamp ns][2 attempts][16 id][body] (docs/protocol.md §1.6).
_MESSAGE_HEADER = struct.Struct(">qH16s")
MESSAGE_HEADER_SIZE = _MESSAGE_HEADER.size

# A send that makes no progress for this long means the connection is gone.
SEND_TIMEOUT = 30.0
# Go nsqd's default --max-rdy-count, used when IDENTIFY does not report one.
DEFAULT_MAX_RDY_COUNT = 2500
# One recv takes everything nsqd has sent so far, up to this: a full RDY window of small
# messages arrives in a few reads, and each read becomes one chunk in the inbox.
RECEIVE_SIZE = 1024 * 1024
# Errors nsqd sends for a FIN/REQ/TOUCH of a message that already timed out: the message is
# redelivered, the connection stays usable.
_NON_FATAL_ERRORS = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")
_HEARTBEAT = b"_heartbeat_"


class TooFewInFlight(ValueError):
    """The nsqd caps a connection's RDY below what the reader must hold at once."""

    def __init__(self, address: str, max_rdy_count: int, hold: int) -> None:
        super().__init__(
            f"nsq: nsqd {address} lets a connection hold {max_rdy_count} messages"
            f" (--max-rdy-count), fewer than the {hold} a task holds until Spark took its rows"
        )
        self.max_rdy_count = max_rdy_count


class Subscription:
    def __init__(
        self,
        address: str,
        topic: str,
        channel: str,
        *,
        max_in_flight: int,
        msg_timeout: float,
        inbox: "queue.SimpleQueue[tuple[Subscription, list[Delivery]]]",
        http_address: str | None = None,
        security: Security | None = None,
        hold: int | None = None,
    ) -> None:
        """`hold`: how many messages the reader keeps in flight at once without finishing
        any; an nsqd that lets a connection hold fewer is refused (TooFewInFlight) before
        anything is sent to this connection."""
        self.address = address
        self.http_address = http_address
        self.inbox = inbox
        # RDY 0 first: the real count has to respect the max_rdy_count IDENTIFY reports.
        self.consumer = Consumer(
            address,
            topic,
            channel,
            max_in_flight=0,
            identify={"msg_timeout": int(msg_timeout * 1000)},
            security=security,
        )
        self.max_rdy_count = int(
            self.consumer.identify_reply.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)
        )
        if hold is not None and self.max_rdy_count < hold:
            self.consumer.close()
            raise TooFewInFlight(address, self.max_rdy_count, hold)
        self.max_in_flight = max(1, min(max_in_flight, self.max_rdy_count))
        self.touch_interval = msg_timeout / 2
        self.error: BaseException | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        # id -> attempts of the latest delivery not yet FINished or REQueued (to TOUCH).
        self._unfinished: dict[bytes, int] = {}
        self._outbox: deque[bytes] = deque()
        self._flushed = threading.Condition(self._lock)
        self._sent_through = 0
        self._queued_through = 0
        self._wake_receiver, self._wake_sender = socket.socketpair()
        self._wake_sender.setblocking(False)
        self._enqueue(encode_rdy(self.max_in_flight))
        self._thread = threading.Thread(
            target=self._run, name=f"nsq-subscription-{address}", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self.error is None and not self._closing.is_set()

    # -- called by the reader -----------------------------------------------------------------

    def finish(self, deliveries: Iterable[Delivery]) -> None:
        """Queue a FIN for each delivery; `flush` waits until they are on the socket.

        A delivery that has since been redelivered (higher attempts) is left alone: that copy
        is in a later batch, which will FIN it once Spark has committed that batch.
        """
        message_ids = []
        with self._lock:
            unfinished = self._unfinished
            for delivery in deliveries:
                message_id = delivery[0]
                if unfinished.get(message_id) == delivery[2]:
                    del unfinished[message_id]
                    message_ids.append(message_id)
        if message_ids:
            self._enqueue(b"FIN " + b"\nFIN ".join(message_ids) + b"\n")

    def requeue(self, deliveries: Iterable[Delivery]) -> None:
        """REQ deliveries that were received but will not be handed to Spark."""
        message_ids = []
        with self._lock:
            for delivery in deliveries:
                if self._unfinished.pop(delivery[0], None) is not None:
                    message_ids.append(delivery[0])
        if message_ids:
            self._enqueue(b"REQ " + b" 0\nREQ ".join(message_ids) + b" 0\n")

    def ready(self, max_in_flight: int) -> None:
        """Change the RDY count (capped by nsqd's max_rdy_count)."""
        self.max_in_flight = max(1, min(max_in_flight, self.max_rdy_count))
        self._enqueue(encode_rdy(self.max_in_flight))

    def pause(self) -> None:
        self._enqueue(encode_rdy(0))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is on the socket (False: timed out, or the
        connection failed first)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._queued_through
            while self._sent_through < target and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._flushed.wait(remaining)
            return self._sent_through >= target

    def close(self) -> None:
        self._closing.set()
        self._wake()
        self._thread.join(timeout=5)
        self.consumer.close()
        self._wake_receiver.close()
        self._wake_sender.close()

    # -- the thread ---------------------------------------------------------------------------

    def _enqueue(self, data: bytes) -> None:
        with self._lock:
            self._outbox.append(data)
            self._queued_through += 1
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_sender.send(b"\0")
        except (BlockingIOError, OSError):
            # The pair's buffer is full (the thread is already due to wake up) or closed.
            pass

    def _send_outbox(self) -> None:
        with self._lock:
            data = b"".join(self._outbox)
            count = len(self._outbox)
            self._outbox.clear()
        if data:
            self.consumer.sock.sendall(data)
        if count:
            with self._lock:
                self._sent_through += count
                self._flushed.notify_all()

    def _touch_unfinished(self) -> None:
        with self._lock:
            message_ids = list(self._unfinished)
        if message_ids:
            self.consumer.sock.sendall(b"TOUCH " + b"\nTOUCH ".join(message_ids) + b"\n")

    def _deliver(self, frames: Iterable[Frame]) -> None:
        """Hand the messages among `frames` to the inbox as one chunk; answer heartbeats."""
        unpack_header = _MESSAGE_HEADER.unpack_from
        chunk: list[Delivery] = []
        for frame in frames:
            data = frame.data
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                if len(data) < MESSAGE_HEADER_SIZE:
                    raise ProtocolError("E_BAD_MESSAGE", f"a {len(data)}-byte message frame")
                timestamp, attempts, message_id = unpack_header(data)
                chunk.append((message_id, data[MESSAGE_HEADER_SIZE:], attempts, timestamp))
            elif frame.frame_type == FRAME_TYPE_ERROR:
                if not data.startswith(_NON_FATAL_ERRORS):
                    raise NSQError(data.decode("utf-8", "replace"))
            elif data == _HEARTBEAT:
                self.consumer.sock.sendall(NOP)
        if chunk:
            with self._lock:
                self._unfinished.update((d[0], d[2]) for d in chunk)
            self.inbox.put((self, chunk))

    def _run(self) -> None:
        sock = self.consumer.sock
        decoder = self.consumer.decoder
        try:
            # The handshake read with a short timeout; from here on, recv only runs once
            # select says there is data, and a send to a busy nsqd may block a while.
            sock.settimeout(SEND_TIMEOUT)
            self._deliver(self.consumer.frames)
            self.consumer.frames.clear()
            next_touch = time.monotonic() + self.touch_interval
            while not self._closing.is_set():
                self._send_outbox()
                now = time.monotonic()
                if now >= next_touch:
                    self._touch_unfinished()
                    next_touch = now + self.touch_interval
                readable, _, _ = select.select(
                    [sock, self._wake_receiver], [], [], max(0.0, next_touch - now)
                )
                if self._wake_receiver in readable:
                    self._wake_receiver.recv(4096)
                if sock in readable:
                    # Over TLS, everything already decrypted too: select would not tell of it.
                    data = receive_available(sock, RECEIVE_SIZE)
                    if not data:
                        raise ConnectionError(f"nsqd {self.address} closed the connection")
                    self._deliver(decoder.receive_data(data))
        except (OSError, NSQError, ProtocolError) as error:
            # ConnectionError is an OSError. Unfinished messages come back after their timeout.
            with self._lock:
                self.error = error
                self._flushed.notify_all()
