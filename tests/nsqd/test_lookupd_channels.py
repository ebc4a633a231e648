"""A new topic on nsqd gets the channels the cluster's nsqlookupds know for it, as in Go nsqd's
GetTopic: a channel consumed on another nsqd receives what is published here too, the very
first message included.

The cluster is real: nsqlookupd and two nsqd processes on ephemeral ports. Go nsqlookupd's
answer to `GET /channels` is served from its recorded bytes to check we read Go's format.
"""

import http.server
import threading

import pytest
import trio

from nsqpy.common.command import encode_pub
from nsqpy.common.version import VERSION
from nsqpy.nsqd.lookup import LookupChannelsError, topic_channels
from tests.harness import DaemonProcess, V2Connection, start_nsqd, start_nsqlookupd
from tests.reference import REFERENCE_DIR
from tests.support.http import get_json, post
from tests.support.polling import poll


def start_registered_nsqd(data_path, lookupd: DaemonProcess) -> DaemonProcess:
    data_path.mkdir(exist_ok=True)
    return start_nsqd(
        data_path,
        f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
        "-broadcast-address=127.0.0.1",
    )


def wait_until_registered(lookupd: DaemonProcess, count: int) -> None:
    port = lookupd.port("HTTP")
    poll(lambda: len(get_json(port, "/nodes")["producers"]) == count, "nsqd registrations")


def channels_of(nsqd: DaemonProcess, topic: str) -> dict[str, int]:
    """Channel name -> depth, from nsqd's /stats."""
    stats = get_json(nsqd.port("HTTP"), f"/stats?format=json&topic={topic}")
    for entry in stats["topics"]:
        if entry["topic_name"] == topic:
            return {channel["channel_name"]: channel["depth"] for channel in entry["channels"]}
    return {}


def topic_depth(nsqd: DaemonProcess, topic: str) -> int:
    stats = get_json(nsqd.port("HTTP"), f"/stats?format=json&topic={topic}")
    return sum(entry["depth"] for entry in stats["topics"] if entry["topic_name"] == topic)


@pytest.fixture
def cluster(tmp_path):
    """nsqlookupd; nsqd A with `orders` (channels archive, proc, and an ephemeral one) known to
    nsqlookupd; nsqd B registered too, without the topic."""
    lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1", cwd=tmp_path)
    a = start_registered_nsqd(tmp_path / "a", lookupd)
    b = start_registered_nsqd(tmp_path / "b", lookupd)
    try:
        post(a.port("HTTP"), "/topic/create?topic=orders")
        for channel in ("archive", "proc", "live#ephemeral"):
            post(a.port("HTTP"), f"/channel/create?topic=orders&channel={channel}")
        poll(
            lambda: (
                sorted(get_json(lookupd.port("HTTP"), "/channels?topic=orders")["channels"])
                == ["archive", "live#ephemeral", "proc"]
            ),
            "the channels in nsqlookupd",
        )
        wait_until_registered(lookupd, 2)
        yield lookupd, a, b
    finally:
        for daemon in (a, b, lookupd):
            daemon.kill()


def publish_tcp(nsqd: DaemonProcess, topic: str, body: bytes) -> None:
    connection = V2Connection(nsqd.port())
    try:
        connection.send(encode_pub(topic, body))
        assert connection.read_response().data == b"OK"
    finally:
        connection.close()


def publish_http(nsqd: DaemonProcess, topic: str, body: bytes) -> None:
    assert post(nsqd.port("HTTP"), f"/pub?topic={topic}", body).body == b"OK"


@pytest.mark.parametrize("publish", [publish_tcp, publish_http], ids=["tcp", "http"])
def test_first_publish_on_a_new_node_reaches_the_channels_lookupd_knows(cluster, publish):
    _lookupd, _a, b = cluster
    publish(b, "orders", b"first order")
    poll(
        lambda: channels_of(b, "orders") == {"archive": 1, "proc": 1},
        "both channels on B, each with the first message",
    )
    assert topic_depth(b, "orders") == 0
    assert "live#ephemeral" not in channels_of(b, "orders")


def test_topic_create_over_http_creates_the_lookupd_channels(cluster):
    _lookupd, _a, b = cluster
    post(b.port("HTTP"), "/topic/create?topic=orders")
    poll(lambda: set(channels_of(b, "orders")) == {"archive", "proc"}, "the channels on B")


def test_unreachable_lookupd_http_leaves_the_topic_without_channels_and_keeps_messages(cluster):
    lookupd, _a, b = cluster
    lookupd.kill()
    publish_tcp(b, "orders", b"kept")
    b.wait_for_log(r"failed to query nsqlookupd for channels to pre-create for topic orders")
    assert channels_of(b, "orders") == {}
    assert topic_depth(b, "orders") == 1
    # Once a consumer makes a channel, the waiting message flows to it.
    post(b.port("HTTP"), "/channel/create?topic=orders&channel=late")
    poll(lambda: channels_of(b, "orders") == {"late": 1}, "the message in the new channel")


def test_a_topic_loaded_from_nsqd_dat_does_not_ask_lookupd(cluster, tmp_path):
    lookupd, a, b = cluster
    publish_tcp(b, "orders", b"before restart")
    poll(lambda: set(channels_of(b, "orders")) == {"archive", "proc"}, "the channels on B")
    assert b.stop() == 0, b.log
    post(a.port("HTTP"), "/channel/create?topic=orders&channel=added-later")
    poll(
        lambda: (
            "added-later" in get_json(lookupd.port("HTTP"), "/channels?topic=orders")["channels"]
        ),
        "the new channel in nsqlookupd",
    )
    restarted = start_registered_nsqd(tmp_path / "b", lookupd)
    try:
        wait_until_registered(lookupd, 2)
        assert set(channels_of(restarted, "orders")) == {"archive", "proc"}
    finally:
        restarted.kill()


def test_no_lookupd_configured_creates_no_channels(tmp_path):
    nsqd = start_nsqd(tmp_path)
    try:
        publish_tcp(nsqd, "orders", b"alone")
        assert channels_of(nsqd, "orders") == {}
        assert topic_depth(nsqd, "orders") == 1
        assert "pre-create" not in nsqd.log
    finally:
        nsqd.kill()


# -- Go nsqlookupd's answer ---------------------------------------------------------------------


class _RecordedGoLookupd(http.server.BaseHTTPRequestHandler):
    """Answers every GET with Go nsqlookupd v1.3.0's recorded `/channels?topic=test` reply."""

    recorded = (REFERENCE_DIR / "nsqlookupd_channels.http").read_bytes()
    paths: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.paths.append(self.path)
        head, _, body = self.recorded.partition(b"\r\n\r\n")
        if not body:
            head, _, body = self.recorded.partition(b"\n\n")
        status_line, *header_lines = head.decode().splitlines()
        self.send_response(int(status_line.split()[1]))
        for line in header_lines:
            name, _, value = line.partition(": ")
            if name.lower() not in ("date", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


async def test_go_lookupd_channels_answer_is_read():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordedGoLookupd)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        assert await topic_channels([address], "test", 5.0) == ["ch"]
        assert _RecordedGoLookupd.paths[-1] == "/channels?topic=test"
    finally:
        server.shutdown()
        server.server_close()


async def test_one_lookupd_down_still_gives_the_others_channels():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordedGoLookupd)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    closed = trio.socket.socket()
    await closed.bind(("127.0.0.1", 0))
    closed_address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        with pytest.raises(LookupChannelsError) as caught:
            await topic_channels([address, closed_address], "test", 5.0)
        assert caught.value.channels == ["ch"]
        assert closed_address in str(caught.value)
    finally:
        server.shutdown()
        server.server_close()


def test_nsqd_logs_lookupds_peer_info_as_go_does(tmp_path):
    """Go nsqd logs nsqlookupd's IDENTIFY answer as its peerInfo struct (`%+v`)."""
    lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1", cwd=tmp_path)
    nsqd = start_registered_nsqd(tmp_path / "nsqd", lookupd)
    try:
        expected = (
            f"LOOKUPD({lookupd.addresses['TCP']}): peer info {{TCPPort:{lookupd.port('TCP')}"
            f" HTTPPort:{lookupd.port('HTTP')} Version:{VERSION} BroadcastAddress:127.0.0.1}}"
        )
        poll(lambda: expected in nsqd.log, "the peer info line")
    finally:
        nsqd.kill()
        lookupd.kill()
