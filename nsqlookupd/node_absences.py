"""When an nsqd whose key is gone from etcd may be taken for gone.

A node's key lives on its lease: it goes when the node stops refreshing it (killed, frozen,
cut off from etcd) and the master then moves its partitions. But a key also goes while its
node is alive and refreshing: etcd 3.4 before 3.4.28 revokes every lease its own clock says
expired when a paused or stuck leader runs again (etcd-io/etcd#15247), and a whole etcd
paused past the lease TTL does the same when it resumes. Taken at its word, that is every
node dead at once: every partition's ISR emptied into catch-up, and writes stopped until
they all caught up again.

So the master asks the node itself before it acts (as Kafka's controller would hear from a
broker's session): a node whose key went is gone once it does not answer `/ping` (refused at
once when its process died; no answer within `PING_TIMEOUT` when it is frozen or its machine
is cut off), or once its key has been gone for a lease TTL, answering or not (a node cut off
from etcd only: it cannot hold its place, and its partitions move). A node that answers is
given that TTL to register again, which a node that lost its lease does at its next refresh.
"""

from dataclasses import dataclass

import trio

from nsqpy import network
from nsqpy.common.cluster_meta import NodeInfo

PING_TIMEOUT = 0.5


@dataclass
class _Absence:
    since: float  # trio's clock
    last_known: NodeInfo | None
    # The last ping: when, and whether it was answered.
    pinged_at: float = -1.0
    answered: bool = False


class NodeAbsences:
    def __init__(self, ttl: float, secret: str = "") -> None:
        self.ttl = ttl
        self.secret = secret
        self._absent: dict[str, _Absence] = {}

    def vanished(self, node: str, last_known: NodeInfo | None, now: float) -> None:
        """`node`'s key was deleted (seen at `now`); `last_known` is what it held."""
        self._absent.setdefault(node, _Absence(now, last_known))

    def returned(self, node: str) -> None:
        self._absent.pop(node, None)

    def absent_since(self, node: str) -> float | None:
        absence = self._absent.get(node)
        return absence.since if absence is not None else None

    def answering(self) -> list[str]:
        """Nodes whose key is gone but which answered their last ping: alive, registering
        again (for `/cluster/stats`)."""
        return sorted(node for node, absence in self._absent.items() if absence.answered)

    async def gone(self, nodes: set[str], now: float) -> set[str]:
        """Which of `nodes` (not registered now) may be taken for gone: those that do not
        answer a ping (asked side by side; one that answered is asked again at most every
        `PING_TIMEOUT`), those absent for a TTL, and those this nsqlookupd never saw
        registered (their key went before it looked)."""
        gone = set()
        asking = []
        for node in nodes:
            absence = self._absent.get(node)
            if absence is None or absence.last_known is None or now - absence.since >= self.ttl:
                gone.add(node)
            elif absence.answered and now - absence.pinged_at < PING_TIMEOUT:
                continue  # it answered a moment ago (a check runs on every change)
            else:
                asking.append((node, absence))
        if asking:
            async with trio.open_nursery() as nursery:
                for _node, absence in asking:
                    nursery.start_soon(self._ping, absence, now)
        gone.update(node for node, absence in asking if not absence.answered)
        return gone

    async def _ping(self, absence: _Absence, now: float) -> None:
        node = absence.last_known
        assert node is not None
        absence.pinged_at = now
        url = f"http://{node.ip}:{node.http_port}/ping"
        answered = False
        with trio.move_on_after(PING_TIMEOUT):
            try:
                # Any answer counts (a `NOK` of a full disk is one).
                await network.current().request(
                    "GET", url, timeout=PING_TIMEOUT, headers=network.bearer(self.secret)
                )
                answered = True
            except OSError:
                pass
        absence.answered = answered
