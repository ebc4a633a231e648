"""Where a log topic's partitions are, how far each one goes, and its channel cursors.

The driver asks it for every partition's retained start and committed end (nsqd's
`/partition/offsets`, from each partition's leader) and, at commit, moves the query's channel
cursor on each leader (`/channel/setoffset`). Executors ask it again for a partition's replicas
when the ones they were given stop answering: bytes and virtual offsets are the same on every
replica, so a range read can go to any of them (docs/protocol.md §6.3).

Leaders come from nsqlookupd (`lookupd`: the smart client's discovery, which follows
failovers, with each partition's in-sync replicas from `/cluster/stats`) or from the nsqds
given (`nsqd_http`), each of which answers for the partitions it holds.
"""

import logging
import time
import urllib.error
from dataclasses import dataclass

from nsqpy.client.blocking import http_json, http_request
from nsqpy.client.security import Security
from nsqpy.client.smart import LookupdDiscovery, LookupUnavailable

log = logging.getLogger("nsqpy.spark")

_ASK_AGAIN_PAUSE = 0.25


class NotALogTopic(ValueError):
    """The topic is a classic one: nsqd cannot read it by position."""


class PartitionsUnavailable(RuntimeError):
    """Partitions nsqlookupd announces that no leader answered for in time."""


@dataclass(frozen=True)
class PartitionRange:
    """A partition's retained start and committed end (virtual offsets), and the HTTP
    addresses of its replicas, the leader first."""

    partition: int
    start: int
    end: int
    replicas: tuple[str, ...]


class NotAuthorized(RuntimeError):
    """An nsqd refused the query's credential (401 or 403): asking again will not help."""


def refused_credential(address: str, route: str, status: int, body: bytes) -> NotAuthorized:
    return NotAuthorized(
        f"nsq: {route} at {address} answered {status} {body[:200].decode(errors='replace')}:"
        ' give the option "authSecret" a secret its auth server grants subscribe (and publish'
        " to write) on the topic"
    )


class PartitionDirectory:
    def __init__(
        self,
        topic: str,
        *,
        lookupd: list[str],
        nsqd_http: list[str],
        timeout: float = 5.0,
        security: Security | None = None,
    ) -> None:
        if not lookupd and not nsqd_http:
            raise ValueError('reading a log topic needs the option "lookupd" or "nsqd_http"')
        self.topic = topic
        self.security = security
        self.nsqd_http = list(nsqd_http)
        self.discovery = LookupdDiscovery(lookupd, http_timeout=timeout) if lookupd else None
        # How many partitions the topic has, from nsqlookupd's meta (0: not known).
        self.partition_num = 0

    # -- where the partitions are ----------------------------------------------------------

    def partitions(self) -> dict[int, PartitionRange]:
        """Every partition whose leader answers now; a partition under election, or whose
        leader is unreachable, is missing until it has one again. NotALogTopic when an nsqd
        says the topic is classic."""
        found: dict[int, PartitionRange] = {}
        for address, expected in self._leaders():
            try:
                document = http_json(
                    address, "/partition/offsets", security=self.security, topic=self.topic
                )
            except urllib.error.HTTPError as error:
                body = error.read() or b""
                if error.code == 400 and b"NOT_A_LOG_TOPIC" in body:
                    raise NotALogTopic(f"topic {self.topic!r} is not a log topic") from None
                if error.code in (401, 403):
                    raise refused_credential(
                        address, "/partition/offsets", error.code, body
                    ) from None
                if error.code != 404:
                    log.warning("nsq: /partition/offsets at %s failed: %s", address, error)
                continue
            except OSError as error:
                log.warning("nsq: /partition/offsets at %s failed: %s", address, error)
                continue
            for entry in document.get("partitions") or []:
                partition = int(entry["partition"])
                if expected is not None and partition not in expected:
                    continue
                if entry.get("role", "leader") != "leader":
                    continue  # a follower: its leader answers for it
                found[partition] = PartitionRange(
                    partition,
                    int(entry["start"]["offset"]),
                    int(entry["end"]["offset"]),
                    (address,),
                )
        if self.discovery is not None and found:
            for partition, isr in self.discovery.replicas(self.topic).items():
                if partition in found:
                    leader = found[partition]
                    others = tuple(a for a in isr if a not in leader.replicas)
                    found[partition] = PartitionRange(
                        partition, leader.start, leader.end, leader.replicas + others
                    )
        return dict(sorted(found.items()))

    def every_partition(self, timeout: float) -> dict[int, PartitionRange]:
        """`partitions()` once it holds every partition nsqlookupd's meta announces, asking
        again until `timeout` (seconds) has passed: a query that starts while a partition is
        under election must not take it for a new one and read it from its beginning.
        PartitionsUnavailable when some still have no leader. With `nsqd_http` alone the
        partitions are those the nsqds hold."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.partitions()
            missing = sorted(set(range(self.partition_num)) - set(found))
            if not missing:
                return found
            if time.monotonic() >= deadline:
                listed = ", ".join(map(str, missing))
                raise PartitionsUnavailable(
                    f"nsq: no leader of partition(s) {listed} of topic {self.topic!r} answered"
                    f" /partition/offsets within {timeout:g}s (under election, or every replica"
                    " is down): where they start and end is not known"
                )
            time.sleep(_ASK_AGAIN_PAUSE)

    def replicas(self, partition: int) -> tuple[str, ...]:
        """Where `partition` can be read now, the leader first (empty when nowhere)."""
        found = self.partitions().get(partition)
        return found.replicas if found is not None else ()

    def _leaders(self) -> list[tuple[str, set[int] | None]]:
        """(nsqd HTTP address, the partitions it leads or None for whichever it holds)."""
        if self.discovery is None:
            return [(address, None) for address in self.nsqd_http]
        try:
            layout = self.discovery.lookup(self.topic, "r")
        except LookupUnavailable as error:
            log.warning("nsq: %s", error)
            return []
        self.partition_num = layout.partition_num
        by_address: dict[str, set[int]] = {}
        for partition, address in layout.http_addresses.items():
            by_address.setdefault(address, set()).add(partition)
        return [(address, partitions) for address, partitions in by_address.items()]

    # -- positions -------------------------------------------------------------------------

    def search(self, replicas: tuple[str, ...], partition: int, **query: str | int) -> int:
        """`/partition/search` (by `timestamp`, `count` or `offset`) on the first replica that
        answers: the virtual offset found. OSError when none does."""
        position = self.search_position(replicas, partition, **query)
        return position[0]

    def search_position(
        self, replicas: tuple[str, ...], partition: int, **query: str | int
    ) -> tuple[int, int]:
        """(offset, count) of `/partition/search` on the first replica that answers."""
        failure: OSError | None = None
        for address in replicas:
            try:
                found = http_json(
                    address,
                    "/partition/search",
                    security=self.security,
                    topic=self.topic,
                    partition=str(partition),
                    **{key: str(value) for key, value in query.items()},
                )
                return int(found["offset"]), int(found["count"])
            except OSError as error:
                failure = error
        raise failure or OSError(f"no replica of partition {partition} of {self.topic!r}")

    # -- the query's cursor ----------------------------------------------------------------

    def set_cursor(self, channel: str, partition: int, leader: str, offset: int) -> None:
        """Move `channel` of `partition` to `offset` on its leader (which replicates it),
        creating the channel first: retention keeps what it has not passed, and nsqadmin
        shows its lag like any consumer's."""
        http_request(
            leader,
            "/channel/create",
            method="POST",
            security=self.security,
            topic=self.topic,
            channel=channel,
            partition=str(partition),
        )
        http_request(
            leader,
            "/channel/setoffset",
            method="POST",
            body=f"virtual_queue:{offset}".encode(),
            security=self.security,
            topic=self.topic,
            channel=channel,
            partition=str(partition),
        )
