"""One consumer connection to one nsqd, owned by a background thread.

The thread is the only user of the socket: it reads messages into a shared inbox, answers
heartbeats (common.client does that while reading), sends the FINs and REQs the reader hands
it, and TOUCHes every unfinished message each msg_timeout/2 so that a batch Spark is still
working on does not time out. nsqd caps TOUCH at delivery + --max-msg-timeout, after which
the message is redelivered anyway: the documented source of duplicates for long batches.

Keeping every send on one thread avoids interleaving a FIN with the NOP that
`Connection.read_frame` writes straight to the socket when a heartbeat arrives.
"""

import queue
import threading
import time
from collections import deque
from collections.abc import Iterable

from common.client import Consumer, Message, NSQError
from common.command import encode_fin, encode_rdy, encode_req, encode_touch

# How long the thread blocks in recv before looking at its outbox: the latency of a FIN.
POLL_INTERVAL = 0.02
# A send that makes no progress for this long means the connection is gone.
SEND_TIMEOUT = 30.0
# Go nsqd's default --max-rdy-count, used when IDENTIFY does not report one.
DEFAULT_MAX_RDY_COUNT = 2500


class Subscription:
    def __init__(
        self,
        address: str,
        topic: str,
        channel: str,
        *,
        max_in_flight: int,
        msg_timeout: float,
        inbox: "queue.SimpleQueue[tuple[Subscription, Message]]",
        http_address: str | None = None,
    ) -> None:
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
        )
        max_rdy = self.consumer.identify_reply.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)
        self.max_in_flight = max(1, min(max_in_flight, max_rdy))
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
        self._enqueue(encode_rdy(self.max_in_flight))
        self._thread = threading.Thread(
            target=self._run, name=f"nsq-subscription-{address}", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self.error is None and not self._closing.is_set()

    # -- called by the reader -----------------------------------------------------------------

    def finish(self, deliveries: Iterable[tuple[bytes, int]], timeout: float = 10.0) -> None:
        """FIN the given (id, attempts) deliveries and wait until the bytes are on the socket.

        A delivery that has since been redelivered (higher attempts) is left alone: that copy
        is in a later batch, which will FIN it once Spark has committed that batch.
        """
        commands = []
        with self._lock:
            for message_id, attempts in deliveries:
                if self._unfinished.get(message_id) == attempts:
                    del self._unfinished[message_id]
                    commands.append(encode_fin(message_id))
        if commands:
            self._enqueue(b"".join(commands), wait=timeout)

    def requeue(self, message_ids: Iterable[bytes]) -> None:
        """REQ messages that were received but will not be handed to Spark."""
        commands = []
        with self._lock:
            for message_id in message_ids:
                if self._unfinished.pop(message_id, None) is not None:
                    commands.append(encode_req(message_id, 0))
        if commands:
            self._enqueue(b"".join(commands))

    def pause(self) -> None:
        self._enqueue(encode_rdy(0))

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        self.consumer.close()

    # -- the thread ---------------------------------------------------------------------------

    def _enqueue(self, data: bytes, wait: float | None = None) -> None:
        with self._lock:
            self._outbox.append(data)
            self._queued_through += 1
            target = self._queued_through
            if wait is not None:
                deadline = time.monotonic() + wait
                while self._sent_through < target and self.error is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._flushed.wait(remaining)

    def _send_outbox(self) -> None:
        with self._lock:
            data = b"".join(self._outbox)
            count = len(self._outbox)
            self._outbox.clear()
        if data:
            self._send(data)
        with self._lock:
            self._sent_through += count
            self._flushed.notify_all()

    def _touch_unfinished(self) -> None:
        with self._lock:
            commands = b"".join(encode_touch(message_id) for message_id in self._unfinished)
        if commands:
            self._send(commands)

    def _send(self, data: bytes) -> None:
        # receive() left the socket with its short poll timeout; a large FIN burst to a busy
        # nsqd must not fail on that.
        self.consumer.sock.settimeout(SEND_TIMEOUT)
        self.consumer.send(data)

    def _run(self) -> None:
        next_touch = time.monotonic() + self.touch_interval
        try:
            while not self._closing.is_set():
                self._send_outbox()
                message = self.consumer.receive(timeout=POLL_INTERVAL)
                if message is not None:
                    with self._lock:
                        self._unfinished[message.id] = message.attempts
                    self.inbox.put((self, message))
                if time.monotonic() >= next_touch:
                    self._touch_unfinished()
                    next_touch = time.monotonic() + self.touch_interval
        except (OSError, NSQError) as error:
            # ConnectionError is an OSError. Unfinished messages come back after their timeout.
            with self._lock:
                self.error = error
                self._flushed.notify_all()
