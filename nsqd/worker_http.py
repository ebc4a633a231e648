"""The HTTP API of one of `--workers` (docs/design.md §15): a request about a topic's
partition is answered by the worker owning it, a request about all of a topic's partitions
by every worker for its own (their answers joined), `/stats` and `/metrics` by all of them
together, and a setting (`/config`, `/disable/write`, `/loglevel/set`) changes on every
worker.

Every worker serves the shared HTTP listeners through this router, and its own topics'
requests on a private port with the plain router (`nsqd/http_api.py`).
"""

import json
import socket
import urllib.parse
from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, cast

import trio

from nsqpy.common.version import VERSION
from nsqpy.daemon.http_forward import HTTPForwarder
from nsqpy.daemon.http_server import (
    UNPLACED,
    CommitWait,
    Request,
    Response,
    first_param,
    query_params,
    v1_response,
)
from nsqpy.nsqd.handoff import Handoff
from nsqpy.nsqd.http_api import partition_scope
from nsqpy.nsqd.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from nsqpy.nsqd.metrics import render_metrics
from nsqpy.nsqd.stats import memory_stats, text_report

if TYPE_CHECKING:
    from nsqpy.nsqd.http_api import HTTPAPI
    from nsqpy.nsqd.server import NSQD

# Settings every worker applies: (method, path or prefix ending in "/").
_EVERY_WORKER = (
    ("PUT", "/config/"),
    ("POST", "/disable/write"),
    ("POST", "/loglevel/set"),
    ("POST", "/debug/freememory"),
    # Each worker removes the unused partitions it would own (`ClusterNode.unused_partitions`).
    ("POST", "/topic/cleanunused"),
)
# Node-wide answers without a topic, each worker's joined (`WorkerRouter._collected`).
_COLLECTED = ("/serverstats", "/message/historystats", "/cluster/partitions", "/debug/connections")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
# How many request lines' routes a worker keeps (`WorkerRouter._route`).
_ROUTES_KEPT = 10_000
# What a worker without the partitions (or the message) a request is about answers; when every
# worker answers so, the most telling is the node's answer (a channel missing from a topic
# that exists says more than a topic missing from a worker that has none of it).
# `WorkerRouter._route` of a request every worker answers for its own partitions, of one
# whose answers are merged, and of a setting every worker applies (a worker's index is never
# negative).
_EVERY_PARTITION = -1
_GATHERED = -2
_EVERYWHERE = -3
_NOT_HERE = (
    "Message ID not in flight",
    "NOT_A_LOG_TOPIC",
    "CHANNEL_NOT_FOUND",
    "TOPIC_NOT_FOUND",
    "E_TOPIC_NOT_EXIST",
)


class WorkerRouter:
    def __init__(self, nsqd: "NSQD", http_api: "HTTPAPI") -> None:
        assert nsqd.worker is not None
        self.nsqd = nsqd
        self.worker = nsqd.worker
        self.local = http_api.router
        self.forwarder = HTTPForwarder()
        self._routes: dict[tuple[str, str, str], object] = {}

    def body_limit(self, method: str, path: str) -> int | None:
        return self.local.body_limit(method, path)

    def _topic_scope(self, request: Request) -> tuple[str, int | None] | None:
        """(topic, partition) a request is about (-1: the default partition, None: every
        partition); None when it names no topic."""
        if "topic=" not in request.query_string:
            return None
        try:
            params = query_params(request)
        except ValueError:
            return None
        topic = first_param(params, "topic")
        if topic is None:
            return None
        return topic, partition_scope(request.method, request.path, params)

    def _route(self, request: Request) -> int | None:
        """Where a request goes, worked out once per request line: `_GATHERED` (every
        worker's answer merged), `_EVERYWHERE` (a setting every worker applies),
        `_EVERY_PARTITION` (each worker for its own partitions), the other worker serving the
        partition it names (`nsqd/placement.py`), or None (answered here). Kept on the request
        too: the poller asks for the move, the inline answer and the dispatch."""
        placed = request.placed
        if placed is not UNPLACED:
            return cast("int | None", placed)
        # Publishers repeat the same request line: remember where each goes.
        key = (request.method, request.path, request.query_string)
        route = self._routes.get(key, UNPLACED)
        if route is UNPLACED:
            if self._gathers(request):
                route = _GATHERED
            elif self._on_every_worker(request):
                route = _EVERYWHERE
            else:
                route = self._topic_route(request)
            if len(self._routes) >= _ROUTES_KEPT:
                self._routes.clear()
            self._routes[key] = route
        request.placed = route
        return cast("int | None", route)

    def _topic_route(self, request: Request) -> int | None:
        """Where a request about a topic goes, its query read once: the other worker serving
        the partition it names, `_EVERY_PARTITION`, or None (answered here)."""
        scope = self._topic_scope(request)
        if scope is None:
            return None
        topic, partition = scope
        if partition is None:
            return _EVERY_PARTITION
        owner = self.nsqd.placement.worker_for(topic.encode(), partition)
        return None if owner is None else owner.index

    def _gathers(self, request: Request) -> bool:
        if request.method != "GET":
            return False
        if request.path in _COLLECTED:
            return "topic=" not in request.query_string
        return request.path in ("/stats", "/metrics")

    def _on_every_worker(self, request: Request) -> bool:
        path = request.path
        return any(
            request.method == method
            and (path.startswith(route) if route.endswith("/") else path == route)
            for method, route in _EVERY_WORKER
        )

    def respond_inline(self, request: Request) -> Response | None:
        return self.local.respond_inline(request) if self._route(request) is None else None

    async def dispatch(self, request: Request) -> Response:
        route = self._route(request)
        if route is None:
            return await self.local.dispatch(request)
        # Judged here, where the client's address is known; the other workers take this
        # worker's word for it.
        refusal = await self.local.check(request)
        if refusal is not None:
            return refusal
        request.headers = {**request.headers, "authorization": f"Bearer {self.worker.secret}"}
        if route == _GATHERED:
            return await self._gathered(request)
        if route == _EVERYWHERE:
            return await self._everywhere(request)
        if route == _EVERY_PARTITION:
            return _joined(await self._each_worker(request))
        return await self._at(route, request)

    def mover(self, request: Request):
        """Where a plain connection goes instead of being answered here (`Mover`): to the
        owner of the topic its request names, where its later requests, most often for the
        same topic, are answered without a hop."""
        owner = self._route(request)
        if owner is None or owner < 0:
            return None
        return partial(self._move_connection, owner, request.remote)

    async def _move_connection(
        self, owner: int, remote: str, sock: socket.socket, pending: bytes
    ) -> None:
        handoff = Handoff(remote_address=remote, pending=pending, http=True)
        self.nsqd.log.debug("HTTP: [%s] moved to worker %d, which owns its topic", remote, owner)
        try:
            await self.worker.hand_off(owner, sock.fileno(), handoff)
        except OSError as error:
            # The owner is down (being started again): the client sees its connection
            # close unanswered, as with a restarting nsqd, and sends again.
            self.nsqd.log.error(
                "WORKER(%d): cannot hand an HTTP connection to worker %d - %s",
                self.worker.index,
                owner,
                error,
            )

    async def commit(self, write_groups: Sequence[CommitWait] = ()) -> None:
        await self.local.commit(write_groups)

    def commit_due(self) -> bool:
        return self.local.commit_due()

    def waits_for_commit(self, response: Response) -> "bool | CommitWait":
        return self.local.waits_for_commit(response)

    def write_pass(self) -> AbstractContextManager[None]:
        return self.local.write_pass()

    # -- answers from other workers -----------------------------------------------------------

    async def _at(self, owner: int, request: Request) -> Response:
        address = self.worker.peers_http.get(owner)
        if address is None:
            return v1_response(500, "INTERNAL_ERROR")
        try:
            return await self.forwarder.forward(address, request)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as error:
            self.nsqd.log.error(
                "WORKER(%d): worker %d did not answer - %s", self.worker.index, owner, error
            )
            return v1_response(500, "INTERNAL_ERROR")

    async def _everywhere(self, request: Request) -> Response:
        answer = await self.local.dispatch(request)
        if answer.status == 200:
            for index in sorted(self.worker.peers_http):
                if index != self.worker.index:
                    await self._at(index, request)
        return answer

    async def _each_worker(self, asked: Request) -> list[Response]:
        """Every worker's answer to `asked`, in the workers' order."""
        answers: list[Response | None] = [None] * self.worker.count

        async def ask(index: int) -> None:
            if index == self.worker.index:
                answers[index] = await self.local.dispatch(asked)
            else:
                answers[index] = await self._at(index, asked)

        async with trio.open_nursery() as nursery:
            for index in range(self.worker.count):
                nursery.start_soon(ask, index)
        return [answer for answer in answers if answer is not None]

    async def _from_every_worker(self, asked: Request) -> list[dict]:
        """Every worker's JSON answer to `asked` (those that answered 200)."""
        return [
            json.loads(answer.body)
            for answer in await self._each_worker(asked)
            if answer.status == 200
        ]

    async def _collected(self, request: Request) -> Response:
        """Youzan's node-wide `/serverstats` and `/message/historystats`: every worker's
        partitions and refused publishes."""
        documents = await self._from_every_worker(request)
        if not documents:
            return v1_response(500, "INTERNAL_ERROR")
        if request.path == "/serverstats":
            document = dict(documents[0])
            document["server_pub_failed"] = sum(d["server_pub_failed"] for d in documents)
            document["health"] = next(
                (d["health"] for d in documents if d["health"] != "OK"), self.nsqd.health
            )
            return v1_response(200, document)
        if request.path == "/debug/connections":
            return v1_response(
                200, {key: sum(d[key] for d in documents) for key in ("clients", "connections")}
            )
        if request.path == "/cluster/partitions":
            document = dict(documents[0])
            reports = _merged(documents, "partitions") or []
            document["partitions"] = sorted(
                reports, key=lambda entry: (entry["topic"], entry["partition"])
            )
            return v1_response(200, document)
        entries = _merged(documents, "node_hourly_pub_size_stats")
        if entries is not None:
            entries.sort(key=lambda entry: (entry["topic_name"], int(entry["topic_partition"])))
        return v1_response(200, {"node_hourly_pub_size_stats": entries})

    async def _gathered(self, request: Request) -> Response:
        """`/stats` or `/metrics` of the whole node: every worker's topics and producers."""
        if request.path in _COLLECTED:
            return await self._collected(request)
        params = query_params(request)
        wanted = {"format": "json", "include_mem": "false"}
        for key in (
            "topic",
            "channel",
            "include_clients",
            "needClients",
            "leaderOnly",
            "partition",
        ):
            value = first_param(params, key)
            if value is not None:
                wanted[key] = value
        query = urllib.parse.urlencode(wanted)
        asked = Request("GET", f"/stats?{query}".encode(), request.headers, b"")
        documents = await self._from_every_worker(asked)
        topics = _merged(documents, "topics")
        if topics is not None:
            topics.sort(key=lambda topic: (topic["topic_name"], topic.get("topic_partition", 0)))
        producers = _merged(documents, "producers")
        health = next(
            (document["health"] for document in documents if document.get("health") != "OK"),
            self.nsqd.health,
        )
        if request.path == "/metrics":
            body = render_metrics(self.nsqd, topics or []).encode()
            return Response(200, body, [("Content-Type", METRICS_CONTENT_TYPE)])
        include_mem = _BOOLEANS.get(first_param(params, "include_mem") or "", True)
        memory = memory_stats() if include_mem else None
        if first_param(params, "format") != "json":
            return v1_response(200, text_report(self.nsqd, topics, producers, memory, health))
        document: dict = {
            "version": VERSION,
            "health": health,
            "start_time": self.nsqd.start_time,
            "topics": topics,
        }
        if memory is not None:
            document["memory"] = memory
        document["producers"] = producers
        control_plane = _control_plane(documents)
        if control_plane is not None:
            document["control_plane"] = control_plane
        return v1_response(200, document)


def _control_plane(documents: list[dict]) -> dict | None:
    """The node's control plane: worker 0's (it holds the node's registration and lease),
    with what any other worker finds wrong (each reaches etcd with a client of its own)."""
    views = [document["control_plane"] for document in documents if document.get("control_plane")]
    if not views:
        return None
    node = dict(views[0])
    node["problems"] = list(dict.fromkeys(p for view in views for p in view["problems"]))
    node["healthy"] = not node["problems"]
    return node


def _merged(documents: list[dict], key: str) -> list | None:
    """The lists under `key` joined; None when no worker had one (Go's null)."""
    parts = [document[key] for document in documents if document.get(key) is not None]
    if not parts:
        return None
    return [entry for part in parts for entry in part]


def _not_here(answer: Response) -> int | None:
    """Where an answer stands in `_NOT_HERE`; None for any other answer."""
    if answer.status not in (400, 404, 500):
        return None
    try:
        text = json.loads(answer.body).get("message")
    except (ValueError, AttributeError):
        return None
    return _NOT_HERE.index(text) if text in _NOT_HERE else None


def _joined(answers: list[Response]) -> Response:
    """One answer from every worker's to a request about all of a topic's partitions: the
    answers of the workers holding some, as one (the first error among them, else the empty
    answer of an action, or their partitions' entries or texts together); when none holds
    any, the most telling refusal."""
    held = [answer for answer in answers if _not_here(answer) is None]
    if not held:
        return min(answers, key=lambda answer: cast(int, _not_here(answer)))
    failed = [answer for answer in held if answer.status != 200]
    if failed:
        return failed[0]
    if len(held) == 1 or not any(answer.body for answer in held):
        return held[0]
    if held[0].body.startswith(b"{"):
        documents = [json.loads(answer.body) for answer in held]
        # `/partition/offsets`' partitions; `/coordinator/stats`' partitions' replicas.
        key = next((key for key in ("partitions", "topic_coord_stats") if key in documents[0]), "")
        if not key:
            return held[0]
        document = dict(documents[0])
        document[key] = sorted(
            (entry for part in documents for entry in part.get(key) or []),
            key=lambda entry: entry["partition"],
        )
        return v1_response(200, document)
    return Response(200, b"".join(answer.body for answer in held), held[0].headers)
