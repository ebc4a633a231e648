"""Idempotent publishing on log topics: the sequence each producer has reached on a partition.

A producer that publishes with `PUB_SEQ`/`MPUB_SEQ` (docs/protocol.md §3.10) names itself and
numbers its messages on each partition from 0. The leader stores a publish whose first
sequence is the next one expected, acknowledges without storing one it already holds (the
retry of a publish whose answer was lost), and refuses a gap or a partial overlap. As Kafka's
idempotent producers, with the producer's ID chosen by the producer, so a retried Spark task
or a restarted client with the same ID is recognised.

The state is kept in the log: the last record of each sequenced publish carries its producer
and sequence (`partition_log.ProducerMark`), replicated with it. A partition rebuilds the
state from the records of the last `--producer-id-expiration` when it is first needed and
whenever the log changed other than by its own appends (groups another leader wrote, a cut
back: so when a node becomes the leader), starting from its newest producer snapshot
(`partition_log/producer_snapshots.py`, written by every replica as its segments roll); a
producer not heard of for that long is forgotten, and may start again at 0.
"""

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nsqpy.common.errors import ProtocolError
from nsqpy.partition_log import PartitionLog

if TYPE_CHECKING:
    from nsqpy.nsqd.log_writer import WriteGroup

# How many checks between two sweeps of expired producers.
_SWEEP_EVERY = 1024


class Repeat:
    """A publish this partition already holds: acknowledged once `group` (the write that
    holds it, None when it is written) is done."""

    __slots__ = ("group",)

    def __init__(self, group: "WriteGroup | None") -> None:
        self.group = group


class _Producer:
    __slots__ = ("written", "pending", "seen")

    def __init__(self, written: int, seen: float) -> None:
        # The last sequence written; -1 before the first.
        self.written = written
        # Appended and not yet written: (first sequence, last sequence, write group).
        self.pending: list[tuple[int, int, WriteGroup]] = []
        self.seen = seen

    def settle(self) -> None:
        """Writes that ended: the written ones move `written` on, failed ones are forgotten
        (their publishes were refused, and are sent again)."""
        while self.pending and self.pending[0][2].done:
            _first, last, group = self.pending.pop(0)
            if group.error is None:
                self.written = max(self.written, last)
            else:
                # What was appended after a failed write was cut back with it.
                self.pending.clear()

    @property
    def last(self) -> int:
        return self.pending[-1][1] if self.pending else self.written


class ProducerSequences:
    """One partition's producers and their sequences."""

    def __init__(
        self,
        log: PartitionLog,
        expiration: Callable[[], float],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._log = log
        # Seconds, read at each use: `--producer-id-expiration` may change (PUT /config).
        self._expiration = expiration
        self._clock = clock
        self._producers: dict[bytes, _Producer] = {}
        # The log's `rewrites` the state was built at; None: not built.
        self._built_at: int | None = None
        self._checks = 0

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, label: str, producer_id: bytes, first: int, count: int) -> Repeat | None:
        """None: store the publish (then `appended`); a Repeat: acknowledge it without
        storing it; ProtocolError (not fatal) for a gap or a partial overlap."""
        now = self._clock()
        self._ensure_built(now)
        producer = self._producers.get(producer_id)
        if producer is not None:
            producer.settle()
        expected = producer.last + 1 if producer is not None else 0
        last = first + count - 1
        if first == expected:
            return None
        name = producer_id.decode()
        if first > expected:
            raise ProtocolError(
                "E_SEQUENCE_GAP",
                f"{label} sequence {first} of producer {name} is past the next one, {expected}",
                fatal=False,
            )
        assert producer is not None  # expected > first >= 0
        if last > producer.last:
            raise ProtocolError(
                "E_SEQUENCE_OVERLAP",
                f"{label} sequences {first}-{last} of producer {name} overlap the stored ones"
                f" (up to {producer.last}) without repeating a publish",
                fatal=False,
            )
        producer.seen = now
        for _pending_first, pending_last, group in producer.pending:
            if last <= pending_last:
                return Repeat(group)
        return Repeat(None)

    def appended(self, producer_id: bytes, first: int, last: int, group: "WriteGroup") -> None:
        """A publish `check` let through is in the log's open write group."""
        now = self._clock()
        producer = self._producers.get(producer_id)
        if producer is None:
            producer = self._producers[producer_id] = _Producer(-1, now)
        producer.pending.append((first, last, group))
        producer.seen = now

    def _ensure_built(self, now: float) -> None:
        # Built again only when the log changed under it (groups another leader wrote, a cut
        # back): a leader whose write epoch moved on (a node joined its ISR) keeps what it
        # knows, including the publishes appended and not yet written, which the log cannot
        # tell yet.
        rewrites = self._log.rewrites
        if self._built_at != rewrites:
            self._rebuild(now)
            self._built_at = rewrites
            return
        self._checks += 1
        if self._checks >= _SWEEP_EVERY:
            self._checks = 0
            self._sweep(now)

    def _rebuild(self, now: float) -> None:
        """The producers of the records of the last expiration period, from the log (its
        newest producer snapshot and the records after it)."""
        since_ns = int((now - self._expiration()) * 1e9)
        self._producers = {
            producer_id: _Producer(sequence, seen_ns / 1e9)
            for producer_id, (sequence, seen_ns) in self._log.producer_state(since_ns).items()
        }

    def _sweep(self, now: float) -> None:
        oldest = now - self._expiration()
        for producer_id, producer in list(self._producers.items()):
            producer.settle()
            if producer.seen < oldest and not producer.pending:
                del self._producers[producer_id]
