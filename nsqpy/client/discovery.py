"""What the nsqlookupds of a cluster say, without I/O: which of them to ask, in what order,
what their answers mean (docs/protocol.md §5.3, §5.4, §5.6).

A round of questions (`LookupdDirectory.lookup_round`, `discover_round`, `replicas_round`) is
a generator: it yields each `LookupdGet` to make and is sent the answer's JSON document (None
for a 404 or an empty body), or thrown the error the GET raised; it returns what it learnt.
The blocking client (`nsqpy.client.smart.LookupdDiscovery`) makes the GETs with urllib, the
trio one (`nsqpy.client.trio.LookupdDiscovery`) on trio streams; both step a round with
`advance`.
"""

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import outcome

from nsqpy.common.version import VERSION

__all__ = [
    "Found",
    "LookupdAnswerError",
    "LookupUnavailable",
    "LookupdDirectory",
    "LookupdGet",
    "SmartClientError",
    "TopicLayout",
    "lookupd_url",
    "merge_lookups",
]

log = logging.getLogger("nsqpy.smart_client")

USER_AGENT = f"nsqpy/{VERSION}"
# The headers of every request to an nsqd's or nsqlookupd's HTTP API: Youzan's lookupd answers
# in the v1 form only to this Accept header (§5.1).
HTTP_HEADERS = {"Accept": "application/vnd.nsq; version=1.0", "User-Agent": USER_AGENT}
# A lookupd that failed is skipped for 1 s, 2 s, 4 s ... up to this, as Youzan's client lowers
# the priority of a lookupd that keeps failing.
LOOKUPD_REST_MAX = 30.0
# What a lookupd's failed GET or unreadable answer raises: the lookupd is skipped for a while.
LOOKUPD_FAILURES = (OSError, ValueError, KeyError, TypeError, AttributeError)


class SmartClientError(Exception):
    """An error of the smart client itself; nsqd's refusals are `nsqpy.client.blocking.NSQError`."""


class LookupUnavailable(SmartClientError):
    """No nsqlookupd answered; `failures` maps each one asked to why."""

    def __init__(self, topic: str, failures: dict[str, str]) -> None:
        details = "; ".join(f"{url}: {reason}" for url, reason in failures.items())
        super().__init__(f"no nsqlookupd answered for topic {topic!r} ({details})")
        self.topic = topic
        self.failures = failures


@dataclass(frozen=True)
class TopicLayout:
    """A topic as every nsqlookupd that answered sees it, merged.

    `partitions` maps a partition to its leader's TCP address (`host:port`); `classic_nodes`
    lists nsqds of lookupds without partitions (Go's nsqlookupd), which take the classic
    `PUB <topic>` and `SUB <topic> <channel>`."""

    topic: str
    access: str
    partitions: dict[int, str]
    partition_num: int = 0
    ordered: bool = False
    extend_support: bool = False
    classic_nodes: tuple[str, ...] = ()
    answered: tuple[str, ...] = ()
    # Each partition's leader's HTTP address (`host:port`), for range reads of log topics.
    http_addresses: dict[int, str] = field(default_factory=dict)
    # The classic nodes' HTTP addresses.
    classic_http_nodes: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Somewhere to go, and every partition the topic's meta announces has a leader here
        (Youzan's client checks this with `meta.partition_num`)."""
        has_nodes = bool(self.partitions or self.classic_nodes)
        return has_nodes and len(self.partitions) >= self.partition_num


def lookupd_url(address: str) -> str:
    """`host:port` or a URL, as the URL to ask."""
    address = address.strip().rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def _peer_address(peer: dict, port: str = "tcp_port") -> str:
    host = str(peer["broadcast_address"])
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{peer[port]}"


def merge_lookups(topic: str, access: str, answers: list[tuple[str, dict | None]]) -> TopicLayout:
    """Merge the `/lookup` documents of several lookupds (None: one that does not know the
    topic, or has no writable partition of it). A partition the lookupds disagree on (one of
    them has not seen a failover yet) goes to the leader most of them name, the first one's
    on a tie; `partition_num` is the largest announced, and the topic is ordered or ext if
    any lookupd says so."""
    votes: dict[int, Counter[str]] = {}
    http_of: dict[str, str] = {}
    classic: dict[str, None] = {}
    classic_http: dict[str, None] = {}
    partition_num = 0
    ordered = extend_support = False
    for _url, document in answers:
        if not document:
            continue
        meta = document.get("meta") or {}
        ordered = ordered or bool(meta.get("ordered"))
        extend_support = extend_support or bool(meta.get("extend_support"))
        if _classic_topic(document):
            for peer in document.get("producers") or []:
                classic[_peer_address(peer)] = None
                if peer.get("http_port"):
                    classic_http[_peer_address(peer, "http_port")] = None
            continue
        partition_num = max(partition_num, int(meta.get("partition_num") or 0))
        for key, peer in (document.get("partitions") or {}).items():
            address = _peer_address(peer)
            votes.setdefault(int(key), Counter())[address] += 1
            if peer.get("http_port"):
                http_of[address] = _peer_address(peer, "http_port")
    partitions = {partition: votes[partition].most_common(1)[0][0] for partition in sorted(votes)}
    if partitions:
        partition_num = max(partition_num, max(partitions) + 1)
    return TopicLayout(
        topic,
        access,
        partitions,
        partition_num,
        ordered,
        extend_support,
        tuple(classic),
        tuple(url for url, _document in answers),
        {p: http_of[a] for p, a in partitions.items() if a in http_of},
        tuple(classic_http),
    )


def _classic_topic(document: dict) -> bool:
    """Whether a `/lookup` answer is of a classic topic: one without partitions (Go's
    nsqlookupd), or whose only partition, 0, several nsqds registered. nsqpy's and Youzan's
    nsqds register a classic topic as partition 0, and the answer names one of them there;
    a partitioned topic's partition is registered by its leader alone. A classic topic is read
    from, and may be written to, every nsqd that has it."""
    if "partitions" not in document:
        return True
    partitions = document.get("partitions") or {}
    if set(partitions) - {"0"}:
        return False
    named = {_peer_address(peer) for peer in partitions.values()}
    return any(_peer_address(peer) not in named for peer in document.get("producers") or [])


@dataclass(frozen=True)
class LookupdGet:
    """A GET a round asks its driver to make: `url` + `path` with the query `params`, with
    HTTP_HEADERS. The answer sent back: the JSON document, None for a 404 (the topic is not
    known, or has no writable partition yet) or an empty body."""

    url: str
    path: str
    params: dict[str, str]


# A round: GETs out, their answers in, what it learnt returned.
Round = Generator[LookupdGet, dict | None, Any]


@dataclass(frozen=True)
class Found:
    """What a round learnt, once it has asked everything."""

    value: Any


def advance(round: Round, answer: outcome.Outcome) -> LookupdGet | Found:
    """Give `round` the outcome of its last GET (`outcome.Value(None)` to start it): its next
    GET, or Found when it is over. An error the round does not take is raised here."""
    try:
        return answer.send(round)
    except StopIteration as done:
        return Found(done.value)


class LookupdDirectory:
    """The nsqlookupds of a cluster and what they say about topics; thread-safe.

    Starts from the addresses given (`host:port` or URLs, always kept) and adds the ones their
    `/listlookup` names, asked again every `rediscover_interval` seconds. A lookupd that fails
    is skipped for a while (1 s, doubling up to 30 s) unless no other one answers.
    """

    def __init__(
        self,
        lookupd_http_addresses: str | Iterable[str],
        *,
        http_timeout: float = 2.0,
        rediscover_interval: float = 60.0,
    ) -> None:
        given = (
            [lookupd_http_addresses]
            if isinstance(lookupd_http_addresses, str)
            else list(lookupd_http_addresses)
        )
        if not given:
            raise ValueError("at least one nsqlookupd HTTP address is needed")
        self.http_timeout = http_timeout
        self.rediscover_interval = rediscover_interval
        self._given = list(dict.fromkeys(lookupd_url(address) for address in given))
        self._learnt: list[str] = []
        self._discovered_at: float | None = None
        self._failures: dict[str, int] = {}
        self._resting_until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._lookups = 0

    @property
    def lookupds(self) -> list[str]:
        """Every lookupd known: the ones given, then the ones learnt."""
        with self._lock:
            return self._given + [url for url in self._learnt if url not in self._given]

    @property
    def lookups(self) -> int:
        """How many `lookup` rounds (one `/lookup` to every lookupd) were made."""
        with self._lock:
            return self._lookups

    def discover_round(self) -> Round:
        """Ask every known lookupd for `/listlookup` and learn the lookupds they list; returns
        every lookupd known. When none answers, the list is kept as it was."""
        learnt: list[str] = []
        answered: list[str] = []
        for url in self._to_ask(self.lookupds, lambda: bool(answered)):
            try:
                document = yield LookupdGet(url, "/listlookup", {})
                nodes = [
                    (str(node["NodeIP"]), str(node["HttpPort"]))
                    for node in (document or {}).get("lookupdnodes") or []
                    if node.get("NodeIP") and node.get("HttpPort")
                ]
            except LOOKUPD_FAILURES as error:
                self._failed(url, error)
                continue
            self._answered(url)
            answered.append(url)
            for host, port in nodes:
                host = f"[{host}]" if ":" in host else host
                learnt.append(lookupd_url(f"{host}:{port}"))
        with self._lock:
            if answered:
                self._learnt = list(dict.fromkeys(learnt))
            self._discovered_at = time.monotonic()
        return self.lookupds

    def lookup_round(self, topic: str, access: str = "r") -> Round:
        """`/lookup?topic=&access=&metainfo=true` on every lookupd, merged (`merge_lookups`)
        into the `TopicLayout` returned. LookupUnavailable when none answers."""
        answers = yield from self.lookup_answers_round(topic, access)
        return merge_lookups(topic, access, answers)

    def lookup_answers_round(self, topic: str, access: str = "r") -> Round:
        """`/lookup?topic=&access=&metainfo=true` on every lookupd: each answer that could be
        read, as `(url, document)` pairs (a caller that needs more of them than the merged
        layout: producers, `meta`). LookupUnavailable when none answers."""
        if access not in ("r", "w"):
            raise ValueError(f"access is 'r' (consumers) or 'w' (producers), not {access!r}")
        with self._lock:
            discovered_at = self._discovered_at
        if discovered_at is None or time.monotonic() - discovered_at >= self.rediscover_interval:
            yield from self.discover_round()
        answers: list[tuple[str, dict | None]] = []
        failures: dict[str, str] = {}
        params = {"topic": topic, "access": access, "metainfo": "true"}
        for url in self._to_ask(self.lookupds, lambda: bool(answers)):
            try:
                document = yield LookupdGet(url, "/lookup", params)
                # An answer that cannot be read counts as no answer.
                merge_lookups(topic, access, [(url, document)])
                answers.append((url, document))
            except LOOKUPD_FAILURES as error:
                failures[url] = str(error)
                self._failed(url, error)
                continue
            self._answered(url)
        with self._lock:
            self._lookups += 1
        if not answers:
            raise LookupUnavailable(topic, failures)
        return answers

    def replicas_round(self, topic: str) -> Round:
        """The HTTP addresses of each partition's in-sync replicas, from the first lookupd that
        answers `/cluster/stats` (docs/protocol.md §5.6); empty outside a cluster."""
        for url in self._to_ask(self.lookupds, lambda: False):
            try:
                document = (yield LookupdGet(url, "/cluster/stats", {})) or {}
                return {
                    int(entry["partition"]): [str(a) for a in entry.get("isr_http") or []]
                    for entry in document.get("partitions") or []
                    if entry.get("topic") == topic
                }
            except LOOKUPD_FAILURES as error:
                if getattr(error, "code", None) == 400:
                    return {}  # E_NOT_CLUSTER: a standalone lookupd
                self._failed(url, error)
        return {}

    def _to_ask(self, urls: list[str], someone_answered: Callable[[], bool]) -> Iterator[str]:
        """The lookupds that are not resting, then, if none of them answered, the resting
        ones too."""
        now = time.monotonic()
        with self._lock:
            resting = [url for url in urls if self._resting_until.get(url, 0.0) > now]
        yield from (url for url in urls if url not in resting)
        if not someone_answered():
            yield from resting

    def _failed(self, url: str, error: BaseException) -> None:
        with self._lock:
            failures = self._failures.get(url, 0) + 1
            self._failures[url] = failures
            rest = min(2.0 ** (failures - 1), LOOKUPD_REST_MAX)
            self._resting_until[url] = time.monotonic() + rest
        log.warning("nsqlookupd %s failed (%s); skipped for %.0fs", url, error, rest)

    def _answered(self, url: str) -> None:
        with self._lock:
            self._failures.pop(url, None)
            self._resting_until.pop(url, None)


class LookupdAnswerError(OSError):
    """A lookupd answered a GET with a status other than 200 and 404; `code` is the status."""

    def __init__(self, url: str, code: int) -> None:
        super().__init__(f"HTTP {code} from {url}")
        self.code = code


def read_lookupd_answer(url: str, status: int, body: bytes) -> dict | None:
    """A lookupd's answer to a `LookupdGet` as the round takes it: the JSON document; None for
    a 404 (`TOPIC_NOT_FOUND`, or no writable partition yet) and for an empty body (a
    standalone Youzan lookupd's `/listlookup`); LookupdAnswerError for another failure."""
    if status == 404:
        return None
    if not 200 <= status < 300:
        raise LookupdAnswerError(url, status)
    return json.loads(body) if body.strip() else None
