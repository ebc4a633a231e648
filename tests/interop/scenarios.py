"""The scenarios every real client plays against our nsqd, and the report it gives back.

Each client (pynsq, ansq, gnsq, nsqjs) plays the same four scenarios and reports what it saw
as one JSON-able `Report`; `support.py` judges the report and the server's own counters the
same way for every client:

- ``pubsub``: 10,000 messages published as 2,000 PUBs and 80 MPUBs of 100 (rounds of 25 PUBs
  then one MPUB), then consumed with max_in_flight 200; every body is delivered exactly once,
  with attempts 1, and FIN'd.
- ``requeue``: 20 messages; on its first delivery every message with an even index is
  requeued with no delay (REQ <id> 0); those come back exactly once more, with attempts 2.
- ``timeout``: 3 messages and a 1 s message timeout; the handler never answers the first
  delivery of msg-0, which nsqd must time out and deliver again with attempts 2.
- ``heartbeat``: the consumer IDENTIFYs a 1 s heartbeat interval and sits idle, answering
  heartbeats, until it has seen 3 (so the connection is idle past Go's read deadline of two
  intervals); only then is one message published, and it must still arrive.

Everything is published before the consumer subscribes (except in ``heartbeat``), so nsqd
also has to hand a topic's backlog to a channel created after it.

This module is plain Python so that the gevent script can import it before anything else;
`node/pubsub.js` implements the same plan: keep it in step with `publish_plan` and
`first_attempt_action`.
"""

from collections import Counter
from dataclasses import asdict, dataclass, field

MAX_IN_FLIGHT = 200
PUBS_PER_ROUND = 25
MPUB_SIZE = 100
MSG_TIMEOUT_MS = 1000  # Go's smallest IDENTIFY msg_timeout
HEARTBEAT_INTERVAL_MS = 1000  # Go's smallest IDENTIFY heartbeat_interval
HEARTBEATS_BEFORE_PUBLISH = 3

COUNTS = {"pubsub": 10_000, "requeue": 20, "timeout": 3, "heartbeat": 1}

# A client run must end within this, whole; clients in scripts stop themselves at it too.
CLIENT_DEADLINE = 45.0
# How long a client stays connected, once it has all its messages, for nsqd to settle.
SETTLE_DEADLINE = 10.0


def message_bodies(count: int) -> list[str]:
    return [f"msg-{index}" for index in range(count)]


def body_index(body: str) -> int:
    return int(body.rsplit("-", 1)[1])


def publish_plan(bodies: list[str]) -> list[tuple[str, list[str]]]:
    """("pub", [body]) and ("mpub", [bodies...]) commands: rounds of 25 PUBs then an MPUB."""
    commands: list[tuple[str, list[str]]] = []
    position = 0
    while position < len(bodies):
        for body in bodies[position : position + PUBS_PER_ROUND]:
            commands.append(("pub", [body]))
        position += PUBS_PER_ROUND
        batch = bodies[position : position + MPUB_SIZE]
        if batch:
            commands.append(("mpub", batch))
        position += len(batch)
    return commands


def first_attempt_action(scenario: str, body: str) -> str:
    """What a handler does with a message on its first attempt: finish, requeue or hold."""
    index = body_index(body)
    if scenario == "requeue" and index % 2 == 0:
        return "requeue"
    if scenario == "timeout" and index == 0:
        return "hold"
    return "finish"


def handler_action(scenario: str, body: str, attempts: int) -> str:
    return first_attempt_action(scenario, body) if attempts == 1 else "finish"


def expected_attempts(scenario: str) -> dict[str, list[int]]:
    """Every delivery each body should get, as its attempts values in order."""
    expected = {}
    for body in message_bodies(COUNTS[scenario]):
        first = first_attempt_action(scenario, body)
        expected[body] = [1] if first == "finish" else [1, 2]
    return expected


def expected_delivery_count(scenario: str) -> int:
    return sum(len(attempts) for attempts in expected_attempts(scenario).values())


@dataclass
class Report:
    """What a client saw; the same shape from every client and script."""

    client: str = ""
    published_ok: int = 0  # OK answers to PUB and MPUB
    publish_errors: list[str] = field(default_factory=list)
    deliveries: list[tuple[str, int]] = field(default_factory=list)  # (body, attempts)
    identify: dict | None = None  # the IDENTIFY reply, where the client exposes it
    heartbeats: int = 0
    heartbeats_before_publish: int = 0
    errors: list[str] = field(default_factory=list)  # error frames, client failures
    disconnects: int = 0  # connections lost before the client closed them

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """The report without the list of deliveries, for failure messages."""
        fields = {k: v for k, v in self.to_json().items() if k != "deliveries"}
        attempts = Counter(attempts for _body, attempts in self.deliveries)
        return f"{fields} deliveries={len(self.deliveries)} by attempts={dict(attempts)}"
