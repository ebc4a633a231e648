"""Message IDs in Go nsqd's GUID layout, as 16 lowercase hex digits (docs/protocol.md §1.6).

`((now_ns >> 20) - twepoch) << 22 | node_id << 12 | sequence`: a timestamp in units of
2^20 ns ("pseudo-milliseconds"), the 10-bit node id and a 12-bit sequence.

Go's factory fails when the clock goes backwards or when 4096 IDs were taken in one
pseudo-millisecond, and nsqd then sleeps and retries. Ours never fails and never sleeps: the
timestamp never moves backwards, and when a pseudo-millisecond's sequence is used up it
borrows the next one. IDs stay unique and increasing; under a burst the timestamp part runs a
little ahead of the clock and falls back in step once the rate drops.
"""

import hashlib
import time
import zlib

NODE_ID_BITS = 10
SEQUENCE_BITS = 12
MAX_NODE_ID = (1 << NODE_ID_BITS) - 1
_SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
_SUFFIXES = [b"%03x" % sequence for sequence in range(1 << SEQUENCE_BITS)]
_TIMESTAMP_SHIFT = NODE_ID_BITS + SEQUENCE_BITS
_ID_MASK = (1 << 64) - 1
# 2010-11-04 01:42:54.288 UTC in pseudo-milliseconds, Go's `twepoch`.
TWEPOCH = 1288834974288


class GUIDFactory:
    def __init__(self, node_id: int, clock=time.time_ns) -> None:
        if not 0 <= node_id <= MAX_NODE_ID:
            raise ValueError(f"node id {node_id} must be in [0,{MAX_NODE_ID + 1})")
        self._node_bits = node_id << SEQUENCE_BITS
        self._clock = clock
        self._last_timestamp = -1
        self._sequence = 0
        # The first 13 hex digits of `_last_timestamp`'s IDs: the low 12 bits (the sequence)
        # are exactly the last 3 digits, so an ID in the same pseudo-millisecond is this
        # prefix and a precomputed suffix.
        self._prefix = b""

    def next_id(self) -> bytes:
        """One ID: the single-message path (PUB, HTTP /pub), without the batch loop."""
        timestamp = self._clock() >> 20
        last = self._last_timestamp
        if timestamp <= last:
            sequence = self._sequence + 1
            if sequence <= _SEQUENCE_MASK:
                self._sequence = sequence
                return self._prefix + _SUFFIXES[sequence]
            timestamp = last + 1  # this pseudo-millisecond is used up: borrow
        self._last_timestamp = timestamp
        self._sequence = 0
        base = (((timestamp - TWEPOCH) << _TIMESTAMP_SHIFT) | self._node_bits) & _ID_MASK
        prefix = self._prefix = b"%013x" % (base >> SEQUENCE_BITS)
        return prefix + _SUFFIXES[0]

    def next_ids(self, count: int) -> list[bytes]:
        """`count` IDs with one clock read, the batch path for MPUB."""
        if count <= 0:
            return []
        timestamp = max(self._clock() >> 20, self._last_timestamp)
        if timestamp == self._last_timestamp:
            sequence = self._sequence + 1
        else:
            sequence = 0
        ids: list[bytes] = []
        node_bits = self._node_bits
        remaining = count
        while remaining:
            if sequence > _SEQUENCE_MASK:
                timestamp += 1
                sequence = 0
            room = min(remaining, _SEQUENCE_MASK + 1 - sequence)
            # Go's guid is an int64 written out as its 8 bytes, so a clock before twepoch
            # (a fake clock) gives two's complement, still 16 hex digits.
            base = (((timestamp - TWEPOCH) << _TIMESTAMP_SHIFT) | node_bits) & _ID_MASK
            # The low 12 bits are exactly the last 3 hex digits, so the other 13 digits are
            # formatted once per batch and each ID is that prefix plus a precomputed suffix.
            prefix = b"%013x" % (base >> SEQUENCE_BITS)
            ids += [prefix + suffix for suffix in _SUFFIXES[sequence : sequence + room]]
            sequence += room
            remaining -= room
        self._last_timestamp = timestamp
        self._sequence = sequence - 1
        self._prefix = prefix
        return ids


def guid_fields(message_id: bytes) -> tuple[int, int, int]:
    """(pseudo-millisecond timestamp, node id, sequence) of a hex ID; for tests and debugging."""
    value = int(message_id, 16)
    if value >> 63:  # an int64 in Go: the timestamp part may be negative
        value -= 1 << 64
    return (
        (value >> _TIMESTAMP_SHIFT) + TWEPOCH,
        (value >> SEQUENCE_BITS) & MAX_NODE_ID,
        value & _SEQUENCE_MASK,
    )


def default_node_id(hostname: str) -> int:
    """Go nsqd's default `--node-id`: crc32(md5(hostname)) % 1024."""
    return zlib.crc32(hashlib.md5(hostname.encode()).digest()) % (MAX_NODE_ID + 1)
