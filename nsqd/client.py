"""One V2 connection's state: identity, negotiated settings, RDY and counters (Go's clientV2).

IDENTIFY writes the negotiated settings here (`nsqd/identify.py`); the connection reads them.
"""

import itertools
import time
from typing import TYPE_CHECKING

from nsqpy.nsqd.ext_filter import ExtFilter
from nsqpy.nsqd.wakeup import Wakeup

if TYPE_CHECKING:
    from nsqpy.daemon.auth import AuthState
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.connection_poller import PolledWakeup
    from nsqpy.nsqd.options import Options

# Go's connection states and their numbers (docs/protocol.md §1.5); Go's Disconnected (1) and
# Connected (2) are never entered by a V2 connection.
STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

# Go nsqd's bufio default, the IDENTIFY default for output_buffer_size.
DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
# Youzan's limit on a consumer's messages in flight until `/channel/setclientlimit` sets one.
DEFAULT_LIMITED_READY = 50_000

_client_ids = itertools.count(1)


def number_client_ids(first: int, step: int) -> None:
    """Number the clients from here on `first`, `first + step`, ...: the workers of one nsqd
    (`--workers`) interleave, so an ID names one client across all of them."""
    global _client_ids
    _client_ids = itertools.count(first, step)


class Client:
    def __init__(self, options: "Options", remote_address: str) -> None:
        self.id = next(_client_ids)
        self.remote_address = remote_address
        self.state = STATE_INIT
        # Until IDENTIFY says otherwise Go uses the host part of the address for both.
        host = remote_address.rsplit(":", 1)[0]
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.heartbeat_interval = options.client_timeout / 2
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout = options.output_buffer_timeout
        self.msg_timeout = options.msg_timeout
        self.sample_rate = 0
        self.tls = False
        # Whether a TLS-requiring nsqd still waits for this client's upgrade (the interpreter
        # sets it): until then, nothing but IDENTIFY.
        self.tls_gate = False
        self.tls_cipher_suite = ""
        self.tls_version = ""
        self.tls_negotiated_protocol = ""
        self.tls_negotiated_protocol_is_mutual = False
        self.tls_common_name = ""
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.auth_secret = ""
        self.auth_state: AuthState | None = None
        # Youzan's IDENTIFY keys (docs/protocol.md §3.4, §8 #1).
        self.asked_for_youzan = False
        self.extend_support = False
        self.desired_tag = ""
        # Youzan's `ext_filter` (nsqd/ext_filter.py): which ext topic messages it receives.
        self.ext_filter: ExtFilter | None = None

        self.channel: Channel | None = None
        self.ready_count = 0
        # Youzan's `/channel/setclientlimit` cap on messages in flight, whatever RDY says.
        self.limited_ready = DEFAULT_LIMITED_READY
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_time = time.time()
        # Set whenever something may let the message pump send: messages, RDY, FIN, close
        # (the connection poller's pump task's while the poller serves the connection).
        self.wakeup: Wakeup | PolledWakeup = Wakeup()

    def wake(self) -> None:
        """What a channel tells its consumer: messages may be there for it now."""
        self.wakeup.set()

    def is_ready(self) -> bool:
        """Go's IsReadyForMessages: subscribed, channel running, room under RDY."""
        channel = self.channel
        return (
            channel is not None
            and not channel.paused
            and self.in_flight_count < self.ready_count
            and self.in_flight_count < self.limited_ready
            and self.state == STATE_SUBSCRIBED
        )

    def room(self) -> int:
        """How many more messages it may have in flight now."""
        return min(self.ready_count, self.limited_ready) - self.in_flight_count

    def set_limited_ready(self, count: int) -> None:
        self.limited_ready = count
        self.wakeup.set()

    def set_ready_count(self, count: int) -> None:
        self.ready_count = count
        self.wakeup.set()

    def sent_messages(self, count: int) -> None:
        self.message_count += count
        self.in_flight_count += count

    def finished_message(self, count: int = 1) -> None:
        self.finish_count += count
        self.in_flight_count -= count
        self.wakeup.set()

    def requeued_message(self) -> None:
        self.requeue_count += 1
        self.in_flight_count -= 1
        self.wakeup.set()

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1
        self.wakeup.set()

    def empty_in_flight(self) -> None:
        self.in_flight_count = 0
        self.wakeup.set()

    def published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count

    def start_close(self) -> None:
        """CLS: no more messages; in-flight ones may still be FINished."""
        self.ready_count = 0
        self.state = STATE_CLOSING
        self.wakeup.set()

    def channel_deleted(self) -> None:
        """Go closes the connections of a deleted channel's clients."""
        self.close_by_server()

    def close_by_server(self) -> None:
        """nsqd ends the connection: its channel was deleted, or this node no longer leads
        the partition (the client looks the new leader up)."""
        self.state = STATE_CLOSING
        self.closed_by_server = True
        self.wakeup.set()

    closed_by_server = False

    def tls_stats(self) -> dict:
        """The TLS fields of Go's client stats; filled in once the connection is on TLS."""
        return {
            "tls": self.tls,
            "tls_cipher_suite": self.tls_cipher_suite,
            "tls_version": self.tls_version,
            "tls_negotiated_protocol": self.tls_negotiated_protocol,
            "tls_negotiated_protocol_is_mutual": self.tls_negotiated_protocol_is_mutual,
        }

    def __str__(self) -> str:
        return f"{self.remote_address}"
