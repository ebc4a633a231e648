"""The smart producer's idempotent publishing (docs/protocol.md §3.10): a publish whose answer
is lost is sent again and stored once.

An nsqlookupd and an nsqd run as subprocesses; the nsqd advertises a proxy's port
(`-broadcast-tcp-port`), so the producer reaches it through the proxy, which loses the answer
to the first publish of the first connection (it closes both sides instead of passing the
`OK` on), as a leader that stored a publish and died before answering would.
"""

import socket
import struct
import threading

import pytest
import trio

from nsqpy.client.blocking import http_json
from nsqpy.client.smart import SmartProducer
from nsqpy.client.trio import SmartProducer as TrioSmartProducer
from tests.harness import create_partitioned_topic, start_nsqd, start_nsqlookupd
from tests.support.polling import poll

_FRAME = struct.Struct(">ii")


class AnswerLosingProxy:
    """Forwards TCP connections to `target` (set once the nsqd listens); the first connection
    loses the answer that follows IDENTIFY's."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self.lost = threading.Event()
        self._connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            assert self.target is not None
            server = socket.create_connection(self.target)
            self._connections += 1
            lose = self._connections == 1
            threading.Thread(target=_pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client, lose), daemon=True).start()

    def _answers(self, server: socket.socket, client: socket.socket, lose: bool) -> None:
        buffer = b""
        responses = 0
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            while len(buffer) >= 8:
                size, _frame_type = _FRAME.unpack_from(buffer)
                if len(buffer) < 4 + size:
                    break
                frame, buffer = buffer[: 4 + size], buffer[4 + size :]
                responses += 1
                if lose and responses == 2:
                    self.lost.set()
                    # shutdown, not close alone: the other thread's recv() on these sockets
                    # keeps them open, and the client must see the connection end.
                    for sock in (server, client):
                        sock.shutdown(socket.SHUT_RDWR)
                        sock.close()
                    return
                client.sendall(frame)
        client.close()

    def close(self) -> None:
        self._listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    while True:
        try:
            data = source.recv(65536)
        except OSError:
            break
        if not data:
            break
        try:
            sink.sendall(data)
        except OSError:
            break
    sink.close()


@pytest.fixture
def behind_proxy(tmp_path):
    """(nsqlookupd HTTP, nsqd HTTP, proxy): the nsqd is reached through the proxy."""
    proxy = AnswerLosingProxy()
    lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1")
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(
        data,
        f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
        "-broadcast-address=127.0.0.1",
        f"-broadcast-tcp-port={proxy.port}",
    )
    host, port = nsqd.addresses["TCP"].rsplit(":", 1)
    proxy.target = (host, int(port))
    lookupd_http = lookupd.addresses["HTTP"]
    poll(lambda: http_json(lookupd_http, "/nodes")["producers"], "the nsqd to register")
    try:
        yield lookupd_http, nsqd.addresses["HTTP"], proxy
    finally:
        proxy.close()
        nsqd.stop()
        lookupd.stop()


def stored(nsqd_http: str, topic: str) -> int:
    stats = http_json(nsqd_http, "/stats", format="json", topic=topic)
    return sum(t["message_count"] for t in stats["topics"] if t["topic_name"] == topic)


@pytest.mark.parametrize(("idempotent", "copies"), [(True, 1), (False, 2)])
def test_a_publish_whose_answer_was_lost_is_stored_once(behind_proxy, idempotent, copies):
    """Idempotent (the default): the retry is acknowledged without being stored again. Not
    idempotent: the same loss stores it twice, which is what the default prevents."""
    lookupd_http, nsqd_http, proxy = behind_proxy
    create_partitioned_topic(lookupd_http, nsqd_http, "orders", 1, "c")
    with SmartProducer([lookupd_http], idempotent=idempotent) as producer:
        result = producer.multi_publish("orders", [b"a", b"b", b"c"], partition=0)
        assert proxy.lost.is_set() and result.attempts == 2
        assert stored(nsqd_http, "orders") == 3 * copies
        # The producer goes on from the next sequences.
        producer.publish("orders", b"d", partition=0)
    assert stored(nsqd_http, "orders") == 3 * copies + 1


@pytest.mark.parametrize(("idempotent", "copies"), [(True, 1), (False, 2)])
def test_the_trio_producer_stores_a_publish_whose_answer_was_lost_once(
    behind_proxy, idempotent, copies
):
    lookupd_http, nsqd_http, proxy = behind_proxy
    create_partitioned_topic(lookupd_http, nsqd_http, "orders", 1, "c")

    async def publish() -> None:
        async with TrioSmartProducer([lookupd_http], idempotent=idempotent) as producer:
            await producer.multi_publish("orders", [b"a", b"b", b"c"], partition=0)
            assert proxy.lost.is_set()
            await producer.publish("orders", b"d", partition=0)

    trio.run(publish)
    assert stored(nsqd_http, "orders") == 3 * copies + 1
