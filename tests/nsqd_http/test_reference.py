"""Our nsqd's HTTP responses against Go nsqd v1.3.0's, for every captured `nsqd_*.http` file.

`tests/reference/go-1.3.0/` holds the raw `curl -i` output of Go nsqd for the requests of
its INDEX.txt, taken in that order against one daemon: topic "test", channel "ch", a consumer
(nsq_tail) connected with RDY 200 that FINs what it gets, a deferred message, and a producer
(to_nsq) for the `_with_producer` capture. Each test builds the same state in a fresh
in-process nsqd by replaying the INDEX up to its file (the consumer and producer over our V2
codec, identifying as nsq_tail and to_nsq did), then compares the response with Go's field by
field:

* the status line, exactly;
* the header names and values: `Date` only has to be a current HTTP date, the name
  `X-Nsq-Content-Type` compares case-insensitively, `Content-Length` must be our body's length;
* JSON bodies: the keys in the same order at every level, the same value types, and the same
  values except the volatile ones (version, start time, hostname, ports, remote addresses,
  connect times, memory figures);
* text bodies: line for line against a regex built from Go's text, with the same volatile parts
  left open.
"""

import codecs
import email.utils
import re
import shlex
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from tests.nsqd.wire import Wire
from tests.reference import REFERENCE_DIR
from tests.support.http import HTTPReply, parse_response, raw_request
from tests.support.polling import wait_until

REFERENCE_FILES = sorted(path.name for path in REFERENCE_DIR.glob("nsqd_*.http"))

# What nsq_tail and to_nsq (go-nsq 1.1.0) sent in IDENTIFY on the capture machine ("vm").
GO_NSQ_IDENTIFY = {
    "client_id": "vm",
    "hostname": "vm",
    "feature_negotiation": True,
    "heartbeat_interval": 30000,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
    "sample_rate": 0,
    "msg_timeout": 0,
    "deflate": False,
    "snappy": False,
    "tls_v1": False,
}
NSQ_TAIL_AGENT = "nsq_tail/1.3.0 go-nsq/1.1.0"
TO_NSQ_AGENT = "to_nsq/1.3.0 go-nsq/1.1.0"
# The producer's two messages: message_bytes goes from 64 to 68 in the capture.
PRODUCER_BODIES = [b"p1", b"p2"]


# -- the reference files and their requests ------------------------------------------------


@dataclass
class Step:
    file: str
    method: str
    target: str
    body: bytes | None


def _shell_word(word: str) -> bytes:
    """A body as INDEX.txt writes it: shell-quoted, `$'...'` for escapes."""
    if word.startswith("$'") and word.endswith("'"):
        return codecs.decode(word[2:-1], "unicode_escape").encode()
    return shlex.split(word)[0].encode() if word else b""


def read_index() -> list[Step]:
    """The nsqd requests of INDEX.txt, in capture order."""
    steps = []
    for line in (REFERENCE_DIR / "INDEX.txt").read_text().splitlines():
        if not line.startswith("nsqd_"):
            continue
        file, _, request_text = line.partition(": ")
        method, url, *rest = request_text.split(" ", 2)
        body = None
        if rest:
            assert rest[0].lstrip().startswith("body="), line
            body = _shell_word(rest[0].lstrip()[len("body=") :])
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        steps.append(Step(file, method, path, body))
    return steps


STEPS = read_index()


def test_every_reference_file_has_a_request_in_the_index():
    assert REFERENCE_FILES, f"no nsqd_*.http in {REFERENCE_DIR}"
    assert sorted(step.file for step in STEPS) == REFERENCE_FILES


def reference(file: str) -> HTTPReply:
    response = parse_response((REFERENCE_DIR / file).read_bytes())
    # The parser reads the capture right: its Content-Length is the body we took.
    assert int(response.header("Content-Length")) == len(response.body), file
    return response


# -- the state the captures were taken in ---------------------------------------------------


class Scenario:
    """Replays the INDEX against our nsqd, doing what the consumer and producer did between."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.consumer: Wire | None = None
        self.producer: Wire | None = None

    async def before(self, file: str) -> None:
        if file == "nsqd_stats_json.http":
            await self.consume(4)
        elif file == "nsqd_stats_json_with_producer.http":
            await self.produce()
            await self.consume(2)

    async def consume(self, count: int) -> None:
        """nsq_tail: connected after the channel was created, RDY 200, FINs every message."""
        if self.consumer is None:
            self.consumer = await Wire.connect(self.nsqd)
            await self.consumer.identify(**GO_NSQ_IDENTIFY, user_agent=NSQ_TAIL_AGENT)
            await self.consumer.subscribe("test", "ch", rdy=200)
        channel = self.nsqd.topics["test"].channels["ch"]
        (client,) = channel.clients.values()
        finished = client.finish_count + count
        messages = await self.consumer.read_messages(count)
        await self.consumer.finish(*messages)

        def settled() -> bool:
            return len(channel.in_flight) == 0 and client.finish_count == finished

        await wait_until(settled)

    async def produce(self) -> None:
        """to_nsq: its own connection, one PUB per line."""
        self.producer = await Wire.connect(self.nsqd)
        await self.producer.identify(**GO_NSQ_IDENTIFY, user_agent=TO_NSQ_AGENT)
        for body in PRODUCER_BODIES:
            await self.producer.send(b"PUB test\n" + len(body).to_bytes(4, "big") + body)
            await self.producer.expect_ok()

    async def replay_until(self, file: str) -> HTTPReply:
        for step in STEPS:
            await self.before(step.file)
            response = await raw_request(
                self.nsqd.http_address, step.method, step.target, step.body
            )
            if step.file == file:
                return response
        raise AssertionError(f"{file} is not in INDEX.txt")

    async def aclose(self) -> None:
        for wire in (self.consumer, self.producer):
            if wire is not None:
                await wire.aclose()


# -- comparing ----------------------------------------------------------------------------

# JSON values that differ between any two runs: only their type is compared.
VOLATILE_JSON = re.compile(
    r"^\$\.(version|start_time|hostname|http_port|tcp_port)$"
    r"|\.remote_address$|\.connect_ts$|^\$\.memory\."
)


def _json_type(value) -> str:
    return "null" if value is None else type(value).__name__


def json_differences(ours, go, path: str = "$") -> list[str]:
    """Where `ours` differs from Go's JSON `go`: key order, types, non-volatile values."""
    if _json_type(ours) != _json_type(go):
        return [f"{path}: {_json_type(ours)} {ours!r}, Go has {_json_type(go)} {go!r}"]
    if isinstance(go, dict):
        if list(ours) != list(go):
            return [f"{path}: keys {list(ours)}, Go has {list(go)}"]
        return [d for key in go for d in json_differences(ours[key], go[key], f"{path}.{key}")]
    if isinstance(go, list):
        if len(ours) != len(go):
            return [f"{path}: {len(ours)} items, Go has {len(go)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(ours, go, strict=True))
            for d in json_differences(a, b, f"{path}[{i}]")
        ]
    if VOLATILE_JSON.search(path) or ours == go:
        return []
    return [f"{path}: {ours!r}, Go has {go!r}"]


def _text_line_pattern(line: str) -> str:
    """A regex for one line of Go's text `/stats`, the volatile parts left open."""
    if line.startswith("nsqd v"):
        return r"nsqd v\d+\.\d+\.\d+ \(built w/[^)]+\)"
    for fixed in ("start_time ", "uptime "):
        if line.startswith(fixed):
            return re.escape(fixed) + r"\S+"
    memory = re.fullmatch(r"(   \w+ +\t)\d+", line)
    if memory:
        return re.escape(memory.group(1)) + r"\d+"
    client = re.fullmatch(r"(\s+\[V2 vm:)\d+( .* connected: )\S+", line)
    if client:
        return re.escape(client.group(1)) + r"\d+" + re.escape(client.group(2)) + r"\S+"
    return re.escape(line)


def text_differences(ours: str, go: str) -> list[str]:
    go_lines = go.split("\n")
    our_lines = ours.split("\n")
    if len(our_lines) != len(go_lines):
        return [f"{len(our_lines)} lines, Go has {len(go_lines)}:\n{ours}\n--- Go:\n{go}"]
    return [
        f"line {number}: {mine!r} does not match Go's {theirs!r}"
        for number, (mine, theirs) in enumerate(zip(our_lines, go_lines, strict=True), 1)
        if not re.fullmatch(_text_line_pattern(theirs), mine)
    ]


def header_differences(ours: HTTPReply, go: HTTPReply) -> list[str]:
    def normalised(response: HTTPReply) -> dict[str, str]:
        headers = {}
        for name, value in response.headers.items():
            if name.lower() == "x-nsq-content-type":
                name = "X-Nsq-Content-Type"
            assert name not in headers, f"header {name} sent twice"
            headers[name] = value
        return headers

    mine, theirs = normalised(ours), normalised(go)
    differences = []
    if set(mine) != set(theirs):
        differences.append(f"header names {sorted(mine)}, Go has {sorted(theirs)}")
    date = mine.get("Date")
    if date is not None:
        if not re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", date):
            differences.append(f"Date {date!r} is not an IMF-fixdate")
        elif abs(email.utils.parsedate_to_datetime(date).timestamp() - time.time()) > 60:
            differences.append(f"Date {date!r} is not now")
    length = mine.get("Content-Length")
    if length is not None and int(length) != len(ours.body):
        differences.append(f"Content-Length {length}, body has {len(ours.body)} bytes")
    for name in set(mine) & set(theirs) - {"Date", "Content-Length"}:
        if mine[name] != theirs[name]:
            differences.append(f"{name}: {mine[name]!r}, Go has {theirs[name]!r}")
    return differences


def response_differences(ours: HTTPReply, go: HTTPReply) -> list[str]:
    differences = []
    if ours.status_line != go.status_line:
        differences.append(f"status line {ours.status_line!r}, Go has {go.status_line!r}")
    differences += header_differences(ours, go)
    if (go.header("Content-Type") or "").startswith("application/json"):
        differences += json_differences(ours.json(), go.json())
    elif go.header("Content-Type") and go.body.startswith(b"nsqd v"):
        differences += text_differences(ours.text, go.text)
    elif ours.body != go.body:
        differences.append(f"body {ours.body!r}, Go has {go.body!r}")
    return differences


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("file", REFERENCE_FILES)
async def test_response_matches_go_nsqd(nsqd, file):
    scenario = Scenario(nsqd)
    try:
        ours = await scenario.replay_until(file)
    finally:
        await scenario.aclose()
    differences = response_differences(ours, reference(file))
    assert not differences, f"{file}:\n  " + "\n  ".join(differences)


def test_comparison_catches_differences():
    """The comparison is not vacuous: it sees order, type and value changes, volatile or not."""
    go = {"version": "1.3.0", "topics": [{"a": 1, "b": None}], "memory": {"x": 1}}
    assert (
        json_differences({"version": "9", "topics": [{"a": 1, "b": None}], "memory": {"x": 7}}, go)
        == []
    )
    assert json_differences(
        {"version": "1.3.0", "topics": [{"b": None, "a": 1}], "memory": {"x": 1}}, go
    )
    assert json_differences(
        {"version": "1.3.0", "topics": [{"a": 2, "b": None}], "memory": {"x": 1}}, go
    )
    assert json_differences(
        {"version": "1.3.0", "topics": [{"a": 1, "b": []}], "memory": {"x": 1}}, go
    )
    assert json_differences(
        {"version": "1.3.0", "topics": [{"a": True, "b": None}], "memory": {"x": 1}}, go
    )
    assert json_differences({"version": 1, "topics": [{"a": 1, "b": None}], "memory": {"x": 1}}, go)
    go_text = reference("nsqd_stats_text.http").text
    assert text_differences(go_text, go_text) == []
    assert text_differences(go_text.replace("depth: 0    ", "depth: 0 "), go_text)
    assert text_differences(go_text.replace("def: 1   ", "def: 2   "), go_text)
