"""The etcd model (`nsqpy/etcd_model.py`) held to real etcd: every scenario here makes its
requests to a real etcd (Debian's etcd-server 3.4, one member, `tests/cluster/etcd_server.py`)
and to the model, and the two transcripts must be the same, answer for answer: revisions,
keys and their versions, transaction outcomes, leases and their TTLs, watches from a
revision, compaction, and the errors with their status and gRPC code.

Only what differs by nature is set aside (`normalized`): the header's cluster, member and
raft term, and lease IDs (each replaced by the order it first appeared in). Time: the real
etcd's passes; the model's is moved on by the scenario's `pass_time` until the same state is
reached, so a lease's expiry is compared by what it leaves, not by when to the millisecond.
"""

import base64
import http.client
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from nsqpy.etcd_model import EtcdModel
from tests.cluster.etcd_server import EtcdServer
from tests.support.polling import poll

# The test etcd's shortest lease: 3/2 of its election timeout (250 ms), rounded up to 1 s.
TEST_ETCD_MINIMUM_TTL = 1


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class RealGateway:
    """Requests to the real etcd's gateway, over HTTP."""

    def __init__(self, server: EtcdServer) -> None:
        self.server = server

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.client_port, timeout=5)
        try:
            connection.request("POST", path, json.dumps(body))
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        if path.endswith("/keepalive") and response.status == 200:
            return 200, json.loads(data.splitlines()[0])
        return response.status, json.loads(data)

    def watch(self, body: dict, wanted: Callable[[list[dict]], bool]) -> list[dict]:
        """The watch stream's messages (`result`s) until `wanted` says they are all there."""
        data = json.dumps(body).encode()
        sock = socket.create_connection(("127.0.0.1", self.server.client_port), timeout=5)
        try:
            sock.sendall(
                b"POST /v3/watch HTTP/1.1\r\nHost: etcd\r\nContent-Length: %d\r\n\r\n" % len(data)
                + data
            )
            buffer = b""
            messages: list[dict] = []
            deadline = time.monotonic() + 10
            while not wanted(messages):
                assert time.monotonic() < deadline, f"watch got only {messages}"
                buffer += sock.recv(65536)
                # Chunked: each message is one JSON line of its own chunk; sizes are hex lines.
                *lines, buffer = buffer.split(b"\r\n")
                for line in lines:
                    if line.startswith(b"{"):
                        messages.append(json.loads(line)["result"])
            return messages
        finally:
            sock.close()

    def pass_time(self, until: Callable[[], bool]) -> None:
        poll(until, "etcd's lease to expire", timeout=15)


class ModelGateway:
    """The same requests answered by the model, on its own clock."""

    def __init__(self) -> None:
        self.model = EtcdModel(minimum_ttl=TEST_ETCD_MINIMUM_TTL)
        self.now = 1000.0
        self._watches: list = []

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        return self.model.handle(path, body, self.now)

    def watch(self, body: dict, wanted: Callable[[list[dict]], bool]) -> list[dict]:
        watch = self.model.watch(body, self.now)
        messages = watch.take()
        self._watches.append((watch, messages))
        assert wanted(messages), f"model watch got only {messages}"
        return messages

    def pass_time(self, until: Callable[[], bool]) -> None:
        for _step in range(200):
            if until():
                return
            self.now += 0.1
            self.model.advance(self.now)
        raise AssertionError("the model's lease never expired")


def normalized(value: Any, leases: dict[str, str] | None = None) -> Any:
    """An answer without what differs between two etcds by nature."""
    leases = {} if leases is None else leases
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            if key == "header" and isinstance(item, dict):
                result[key] = {k: v for k, v in item.items() if k == "revision"}
            elif key in ("ID", "lease") and isinstance(item, str):
                result[key] = leases.setdefault(item, f"lease-{len(leases) + 1}")
            else:
                result[key] = normalized(item, leases)
        return result
    if isinstance(value, list | tuple):
        return [normalized(item, leases) for item in value]
    return value


def events_of(messages: list[dict]) -> list[dict]:
    """A watch's messages, flattened: etcd may batch events differently from one run to the
    next, so what is compared is every event, and the created/canceled flags, in order."""
    flat: list[dict] = []
    for message in messages:
        flat.extend({"event": event} for event in message.get("events", ()))
        flags = {
            k: v for k, v in message.items() if k in ("created", "canceled", "compact_revision")
        }
        if flags:
            flat.append(flags)
    return flat


def event_count(count: int) -> Callable[[list[dict]], bool]:
    return lambda messages: sum(len(m.get("events", ())) for m in messages) >= count


# -- scenarios: each returns its transcript -----------------------------------------------------


def keys_and_revisions(etcd) -> list:
    steps = [
        ("/v3/kv/range", {"key": b64("a")}),
        ("/v3/kv/put", {"key": b64("a"), "value": b64("1")}),
        ("/v3/kv/put", {"key": b64("a"), "value": b64("2"), "prev_kv": True}),
        ("/v3/kv/put", {"key": b64("b"), "value": ""}),
        ("/v3/kv/put", {"key": b64("c/1"), "value": b64("x")}),
        ("/v3/kv/put", {"key": b64("c/2"), "value": b64("y")}),
        ("/v3/kv/put", {"key": "", "value": b64("no key")}),
        ("/v3/kv/range", {"key": b64("a")}),
        ("/v3/kv/range", {"key": b64("a"), "revision": "2"}),
        ("/v3/kv/range", {"key": b64("a"), "revision": "99"}),
        ("/v3/kv/range", {"key": b64("c/"), "range_end": b64("c0")}),
        ("/v3/kv/range", {"key": b64("c/"), "range_end": b64("c0"), "limit": "1"}),
        ("/v3/kv/range", {"key": b64("c/"), "range_end": b64("c0"), "count_only": True}),
        ("/v3/kv/range", {"key": b64("c/"), "range_end": b64("c0"), "keys_only": True}),
        ("/v3/kv/range", {"key": b64("b"), "range_end": "AA=="}),
        ("/v3/kv/deleterange", {"key": b64("nothing")}),
        ("/v3/kv/deleterange", {"key": b64("c/"), "range_end": b64("c0"), "prev_kv": True}),
        ("/v3/kv/range", {"key": b64("c/"), "range_end": b64("c0")}),
        ("/v3/kv/put", {"key": b64("c/1"), "value": b64("again")}),
        ("/v3/kv/range", {"key": b64("c/1")}),
        ("/v3/kv/range", {"key": b64("a"), "range_end": "AA==", "revision": "4"}),
    ]
    return [etcd.post(path, body) for path, body in steps]


def transactions(etcd) -> list:
    def compare(target: str, result: str, **fields) -> dict:
        return {"key": b64("k"), "target": target, "result": result, **fields}

    put = {"request_put": {"key": b64("k"), "value": b64("v")}}
    read = {"request_range": {"key": b64("k")}}
    steps = [
        {"compare": [compare("CREATE", "EQUAL", create_revision="0")], "success": [put]},
        {
            "compare": [compare("CREATE", "EQUAL", create_revision="0")],
            "success": [put],
            "failure": [read],
        },
        {
            "compare": [compare("VERSION", "EQUAL", version="1")],
            "success": [
                put,
            ],
        },
        {"compare": [compare("VERSION", "GREATER", version="1")], "success": [read]},
        {"compare": [compare("VERSION", "LESS", version="2")], "failure": [read]},
        {"compare": [compare("MOD", "NOT_EQUAL", mod_revision="3")], "success": [read]},
        {"compare": [compare("VALUE", "EQUAL", value=b64("v"))], "success": [read]},
        {"compare": [compare("VALUE", "EQUAL", value=b64("w"))], "failure": [read]},
        {"compare": [{"key": b64("absent"), "target": "VALUE", "result": "EQUAL", "value": ""}]},
        {"compare": [compare("LEASE", "EQUAL", lease="0")], "success": [read]},
        {
            "compare": [
                compare("MOD", "GREATER", mod_revision="0"),
                compare("VERSION", "EQUAL", version="9"),
            ],
            "failure": [read],
        },
        # A transaction reads what it wrote, and writes at one revision.
        {
            "success": [
                {"request_put": {"key": b64("t/1"), "value": b64("a")}},
                {"request_put": {"key": b64("t/2"), "value": b64("b")}},
                {"request_range": {"key": b64("t/"), "range_end": b64("t0")}},
                {"request_delete_range": {"key": b64("k")}},
                {"request_delete_range": {"key": b64("nothing")}},
            ]
        },
        {"success": [read]},
        {"success": [{"request_delete_range": {"key": b64("nothing")}}]},
        {"success": [put, put]},
        {"success": [put, {"request_delete_range": {"key": b64("j"), "range_end": b64("l")}}]},
        {"failure": [put, put]},
        {"success": [{"request_put": {"key": b64("x"), "value": b64("1"), "lease": "12345"}}]},
    ]
    return [etcd.post("/v3/kv/txn", body) for body in steps] + [
        etcd.post("/v3/kv/range", {"key": b64("t/"), "range_end": b64("t0")})
    ]


def leases(etcd) -> list:
    transcript = []
    status, granted = etcd.post("/v3/lease/grant", {"TTL": "30"})
    transcript.append((status, granted))
    lease = granted["ID"]
    transcript.append(etcd.post("/v3/lease/grant", {"TTL": "0"}))
    transcript.append(
        etcd.post("/v3/kv/put", {"key": b64("l/1"), "value": b64("x"), "lease": lease})
    )
    transcript.append(
        etcd.post("/v3/kv/put", {"key": b64("l/2"), "value": b64("y"), "lease": lease})
    )
    transcript.append(
        etcd.post("/v3/kv/put", {"key": b64("l/3"), "value": b64("z"), "lease": lease})
    )
    # A put without the lease takes the key off it: the revoke leaves it.
    transcript.append(etcd.post("/v3/kv/put", {"key": b64("l/3"), "value": b64("kept")}))
    transcript.append(
        etcd.post("/v3/kv/put", {"key": b64("x"), "value": b64("1"), "lease": "12345"})
    )
    transcript.append(etcd.post("/v3/kv/range", {"key": b64("l/"), "range_end": b64("l0")}))
    transcript.append(etcd.post("/v3/lease/keepalive", {"ID": lease}))
    transcript.append(etcd.post("/v3/lease/keepalive", {"ID": "12345"}))
    transcript.append(etcd.post("/v3/lease/timetolive", {"ID": "12345"}))
    transcript.append(etcd.post("/v3/lease/revoke", {"ID": lease}))
    transcript.append(etcd.post("/v3/lease/revoke", {"ID": lease}))
    transcript.append(etcd.post("/v3/kv/range", {"key": b64("l/"), "range_end": b64("l0")}))
    return transcript


def an_expiring_lease(etcd) -> list:
    transcript = []
    status, granted = etcd.post("/v3/lease/grant", {"TTL": "1"})
    transcript.append((status, granted))
    put = etcd.post("/v3/kv/put", {"key": b64("e/1"), "value": b64("x"), "lease": granted["ID"]})
    transcript.append(put)
    transcript.append(
        etcd.post("/v3/kv/put", {"key": b64("e/2"), "value": b64("y"), "lease": granted["ID"]})
    )
    etcd.pass_time(lambda: "kvs" not in etcd.post("/v3/kv/range", {"key": b64("e/1")})[1])
    transcript.append(etcd.post("/v3/kv/range", {"key": b64("e/"), "range_end": b64("e0")}))
    start = int(put[1]["header"]["revision"])
    watch = {
        "create_request": {"key": b64("e/"), "range_end": b64("e0"), "start_revision": str(start)}
    }
    transcript.append(events_of(etcd.watch(watch, event_count(4))))
    transcript.append(etcd.post("/v3/lease/keepalive", {"ID": granted["ID"]}))
    return transcript


def watches_and_compaction(etcd) -> list:
    transcript = []
    for path, body in [
        ("/v3/kv/put", {"key": b64("w/a"), "value": b64("1")}),
        ("/v3/kv/put", {"key": b64("w/b"), "value": b64("2")}),
        ("/v3/kv/put", {"key": b64("elsewhere"), "value": b64("3")}),
        ("/v3/kv/put", {"key": b64("w/a"), "value": b64("4")}),
        ("/v3/kv/deleterange", {"key": b64("w/b")}),
    ]:
        transcript.append(etcd.post(path, body))
    prefix = {"key": b64("w/"), "range_end": b64("w0")}
    transcript.append(
        events_of(etcd.watch({"create_request": {**prefix, "start_revision": "2"}}, event_count(4)))
    )
    transcript.append(
        events_of(
            etcd.watch(
                {"create_request": {**prefix, "start_revision": "5", "prev_kv": True}},
                event_count(2),
            )
        )
    )
    transcript.append(events_of(etcd.watch({"create_request": {**prefix}}, lambda m: bool(m))))
    transcript.append(etcd.post("/v3/kv/compaction", {"revision": "4"}))
    transcript.append(etcd.post("/v3/kv/compaction", {"revision": "3"}))
    transcript.append(etcd.post("/v3/kv/compaction", {"revision": "99"}))
    transcript.append(etcd.post("/v3/kv/range", {"key": b64("w/a"), "revision": "3"}))
    transcript.append(etcd.post("/v3/kv/range", {"key": b64("w/a"), "revision": "4"}))
    transcript.append(etcd.post("/v3/kv/range", {**prefix, "revision": "4"}))

    def canceled(messages: list[dict]) -> bool:
        return any(message.get("canceled") for message in messages)

    transcript.append(
        events_of(etcd.watch({"create_request": {**prefix, "start_revision": "2"}}, canceled))
    )
    transcript.append(
        events_of(etcd.watch({"create_request": {**prefix, "start_revision": "4"}}, event_count(2)))
    )
    return transcript


SCENARIOS = [keys_and_revisions, transactions, leases, an_expiring_lease, watches_and_compaction]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_the_model_answers_as_etcd_does(etcd_server, scenario):
    real = normalized(scenario(RealGateway(etcd_server)))
    model = normalized(scenario(ModelGateway()))
    for step, (expected, got) in enumerate(zip(real, model, strict=True)):
        assert got == expected, f"step {step}: etcd answered {expected}, the model {got}"
