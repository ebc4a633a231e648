"""Helpers of the nsqadmin tests: the Go reference captures, a blocking HTTP client, polling
with a deadline, real nsqlookupd/nsqd/nsqadmin processes and a real V2 consumer."""

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from nsqpy.common.command import encode_identify, encode_rdy, encode_sub
from tests.harness import DaemonProcess, V2Connection, start_nsqd
from tests.reference import REFERENCE_DIR
from tests.support.http import HTTPReply, fetch, parse_response
from tests.support.polling import poll

if TYPE_CHECKING:
    from tests.cluster.local_cluster import LocalCluster

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


# -- the Go captures ------------------------------------------------------------------------


def reference(name: str) -> HTTPReply:
    """One `curl -i` capture of tests/reference/go-1.3.0."""
    return parse_response((REFERENCE_DIR / name).read_bytes())


# -- HTTP -----------------------------------------------------------------------------------


def http(
    method: str,
    url: str,
    body: bytes | str | dict | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> HTTPReply:
    """A request to a full URL, whatever its status; a dict body is sent as JSON."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    return fetch(url, method, body, headers, timeout=timeout)


def get_json(url: str) -> Any:
    reply = http("GET", url)
    assert reply.status == 200, (url, reply.status, reply.body)
    return reply.json()


# -- processes ------------------------------------------------------------------------------


def start_nsqadmin(*flags: str) -> DaemonProcess:
    return DaemonProcess("nsqadmin", ["-http-address=127.0.0.1:0", *flags]).start(
        wait_for=("HTTP",)
    )


@dataclass
class Nsqd:
    process: DaemonProcess

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.process.port('HTTP')}"

    @property
    def url(self) -> str:
        return f"http://{self.http_address}"

    @property
    def tcp_port(self) -> int:
        return self.process.port("TCP")

    def stats(self, topic: str | None = None) -> dict:
        query = f"&topic={quote(topic)}" if topic else ""
        return get_json(f"{self.url}/stats?format=json{query}")

    def topic(self, name: str) -> dict | None:
        return next((t for t in self.stats()["topics"] if t["topic_name"] == name), None)

    def channel(self, topic: str, name: str) -> dict | None:
        found = self.topic(topic)
        channels = found["channels"] if found else []
        return next((c for c in channels if c["channel_name"] == name), None)

    def publish(self, topic: str, count: int = 1, body: bytes = b"hello") -> None:
        payload = b"\n".join(body for _ in range(count))
        reply = http("POST", f"{self.url}/mpub?topic={quote(topic)}", payload)
        assert reply.status == 200, reply.body

    def create_channel(self, topic: str, channel: str) -> None:
        """The topic (if need be) and the channel, as an operator would with curl."""
        for path in (
            f"topic/create?topic={topic}",
            f"channel/create?topic={topic}&channel={channel}",
        ):
            reply = http("POST", f"{self.url}/{path}")
            assert reply.status == 200, reply.body


def start_cluster_nsqd(data_path: Path, lookupd: DaemonProcess | None, *extra: str) -> Nsqd:
    data_path.mkdir(parents=True, exist_ok=True)
    flags = [
        "-broadcast-address=127.0.0.1",
        "-e2e-processing-latency-percentile=0.99,0.5",
        *extra,
    ]
    if lookupd is not None:
        flags.append(f"-lookupd-tcp-address=127.0.0.1:{lookupd.port('TCP')}")
    return Nsqd(start_nsqd(data_path, *flags))


@dataclass
class Cluster:
    """One nsqlookupd, two nsqd registered with it, one nsqadmin that asks the nsqlookupd."""

    lookupd: DaemonProcess
    nsqds: list[Nsqd]
    admin: DaemonProcess
    extra: list[DaemonProcess] = field(default_factory=list)

    @property
    def lookupd_url(self) -> str:
        return f"http://127.0.0.1:{self.lookupd.port('HTTP')}"

    @property
    def lookupd_http_address(self) -> str:
        return f"127.0.0.1:{self.lookupd.port('HTTP')}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.admin.port('HTTP')}"

    def create_log_channel(self, topic: str, channel: str) -> None:
        """A one-partition log topic and its channel on every nsqd, once nsqlookupd lists
        them all."""
        for nsqd in self.nsqds:
            for path in (
                f"topic/create?topic={topic}&partition_num=1",
                f"channel/create?topic={topic}&channel={channel}&partition=0",
            ):
                assert http("POST", f"{nsqd.url}/{path}").status == 200
        self.wait_registered(topic)

    def wait_registered(self, topic: str, count: int | None = None) -> None:
        """Until nsqlookupd lists `count` (default: all) nsqd as producers of `topic`."""
        wanted = len(self.nsqds) if count is None else count

        def registered() -> bool:
            reply = http("GET", f"{self.lookupd_url}/lookup?topic={quote(topic)}")
            return reply.status == 200 and len(reply.json()["producers"]) == wanted

        poll(registered, f"{wanted} producers of {topic} in nsqlookupd")

    def wait_in_channels(self, topic: str) -> None:
        """Until every nsqd's `topic` has handed its messages to its channels: a new topic
        holds them until nsqlookupd said which channels it has elsewhere (Go does too)."""

        def handed() -> bool:
            return all((n.topic(topic) or {"depth": 0})["depth"] == 0 for n in self.nsqds)

        poll(handed, f"every nsqd's {topic} handing its messages to its channels")

    def stop(self) -> None:
        for process in [*self.extra, self.admin, *(n.process for n in self.nsqds), self.lookupd]:
            process.stop()


@dataclass
class ReplicatedCluster:
    """A cluster in cluster mode (tests/cluster/local_cluster.py: etcd, one nsqlookupd, three
    nsqd) and an nsqadmin that asks its nsqlookupd."""

    local: "LocalCluster"
    admin: DaemonProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.admin.port('HTTP')}"

    @property
    def lookupd_http_address(self) -> str:
        return f"127.0.0.1:{self.local.lookupds[0].port('HTTP')}"

    def nsqd_http_address(self, node) -> str:
        return f"127.0.0.1:{node.http_port}"

    def create_topic(self, topic: str, partitions: int, replicas: int) -> None:
        """Creates the topic and waits until nsqlookupd lists a producer of every partition:
        the leaders register with it only after they took the lead."""
        self.local.create_topic(topic, partitions, replicas)
        lookup = f"http://{self.lookupd_http_address}/lookup?topic={quote(topic)}"

        def registered() -> bool:
            reply = http("GET", lookup)
            if reply.status != 200:
                return False
            listed = {int(p) for p in reply.json().get("partitions", {})}
            return listed >= set(range(partitions))

        poll(registered, f"nsqlookupd listing every partition of {topic}")


# -- a consumer -----------------------------------------------------------------------------


USER_AGENT = "nsqadmin-tests/1.0 (python)"


def subscribe(nsqd: Nsqd, topic: str, channel: str, ready: int = 0) -> V2Connection:
    """A real V2 consumer on `topic`/`channel` with RDY `ready` (it never FINs)."""
    connection = V2Connection(nsqd.tcp_port)
    connection.send(
        encode_identify({"client_id": "tester", "hostname": "testhost", "user_agent": USER_AGENT})
    )
    connection.read_response()
    connection.send(encode_sub(topic, channel))
    assert connection.read_response().data == b"OK"
    if ready:
        connection.send(encode_rdy(ready))
    return connection


# -- an HTTP endpoint that records what is POSTed to it (notifications) ----------------------


class Recorder:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", 0))
                recorder.headers.append({k.lower(): v for k, v in self.headers.items()})
                recorder.bodies.append(self.rfile.read(length))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/notify"

    def received(self) -> list[dict]:
        return [json.loads(body) for body in list(self.bodies)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
