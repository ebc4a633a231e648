"""What the cluster's nsqd nodes say of their partitions, as nsqlookupd polls it
(`GET /cluster/partitions` on each node, docs/design.md §14): each replica's role,
writability and log end, and what the master derives from them: whether a follower is caught
up (a leader moves only to one that is), whether a leader refuses writes, and each partition's
load (write rate, unconsumed and kept data) for Youzan's load factors.

The calls to nsqd go through `call_node`, on the daemon's network (`nsqpy/network.py`) as the
coordinator's other calls: a few requests a second, each bounded by its timeout.
"""

import json
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus

import trio

from nsqpy import network
from nsqpy.common.cluster_meta import NodeInfo
from nsqpy.nsqlookupd.placement import PartitionKey, PartitionLoad

# A write rate is averaged over about this many seconds.
RATE_WINDOW = 60.0


class NodeCallError(Exception):
    """An nsqd answered with an error (`status`, its `message`), or not at all (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {message}" if status else message)
        self.status = status
        self.message = message


async def call_node(
    node: NodeInfo, method: str, path: str, timeout: float, *, secret: str, **params: object
) -> dict:
    """One request to a node's HTTP API, with the cluster's `secret` (if any); its JSON
    answer. NodeCallError otherwise."""
    query = urllib.parse.urlencode({key: value for key, value in params.items()})
    url = f"http://{node.ip}:{node.http_port}{path}" + (f"?{query}" if query else "")
    try:
        with trio.fail_after(timeout + 1):
            answer = await network.current().request(
                method, url, timeout=timeout, headers=network.bearer(secret)
            )
    except trio.TooSlowError:
        raise NodeCallError(0, f"{node.id}: no answer within {timeout:g} s") from None
    except (OSError, ValueError) as error:
        raise NodeCallError(0, str(error)) from None
    if answer.status >= 400:
        raise NodeCallError(answer.status, _error_message(answer))
    try:
        return json.loads(answer.body) if answer.body else {}
    except ValueError as error:
        raise NodeCallError(0, f"not JSON: {error}") from None


def _error_message(answer: network.HTTPAnswer) -> str:
    """An error answer's `message` (nsqd's JSON), else its status's reason phrase."""
    try:
        return str(json.loads(answer.body).get("message", ""))
    except (ValueError, AttributeError):
        try:
            return HTTPStatus(answer.status).phrase
        except ValueError:
            return ""


@dataclass
class _Rate:
    """A partition's write rate, from its log's end offset over time."""

    offset: int
    at: float
    bytes_per_second: float = 0.0

    def update(self, offset: int, at: float) -> None:
        elapsed = at - self.at
        if elapsed <= 0:
            return
        instant = max(offset - self.offset, 0) / elapsed
        weight = min(elapsed / RATE_WINDOW, 1.0)
        self.bytes_per_second += (instant - self.bytes_per_second) * weight
        self.offset, self.at = offset, at


@dataclass
class NodeReports:
    """The last report of every node, and the loads measured from them."""

    reports: dict[str, dict[PartitionKey, dict]] = field(default_factory=dict)
    reported_at: dict[str, float] = field(default_factory=dict)
    _rates: dict[PartitionKey, _Rate] = field(default_factory=dict)

    def take(self, node: str, answer: dict, now: float) -> None:
        partitions = {}
        for entry in answer.get("partitions") or []:
            key = (str(entry["topic"]), int(entry["partition"]))
            partitions[key] = entry
            if entry.get("role") == "leader":
                offset = int(entry["end"][0])
                rate = self._rates.get(key)
                if rate is None:
                    self._rates[key] = _Rate(offset, now)
                else:
                    rate.update(offset, now)
        self.reports[node] = partitions
        self.reported_at[node] = now

    def forget(self, node: str) -> None:
        self.reports.pop(node, None)
        self.reported_at.pop(node, None)

    def of(self, node: str, key: PartitionKey) -> dict | None:
        return self.reports.get(node, {}).get(key)

    def caught_up(self, key: PartitionKey, node: str) -> bool:
        """Whether `node` last reported itself an in-sync follower of the partition, not
        catching up: as an ISR member it has every message its leader acknowledged (a planned
        transfer still checks that it has the leader's whole log once the leader stopped)."""
        report = self.of(node, key)
        return (
            report is not None
            and report.get("role") == "follower"
            and not report.get("catching_up")
        )

    def loads(self) -> dict[PartitionKey, PartitionLoad]:
        """Each partition's load as its leader reported it."""
        loads = {}
        for partitions in self.reports.values():
            for key, entry in partitions.items():
                if entry.get("role") != "leader":
                    continue
                rate = self._rates.get(key)
                start, end = int(entry["start"][0]), int(entry["end"][0])
                loads[key] = PartitionLoad(
                    write_bytes_per_hour=(rate.bytes_per_second * 3600) if rate else 0.0,
                    depth_bytes=int(entry.get("channel_depth_bytes", 0)),
                    data_bytes=max(end - start, 0),
                )
        return loads
