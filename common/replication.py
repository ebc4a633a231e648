"""The replication protocol between nsqd nodes of a cluster (docs/design.md §14): sans-IO.

Youzan's nsqds replicate over Go's gob RPC, which nothing but Go can speak, so nsqpy has its
own, on each nsqd's `--rpc-port`. Every frame is `[4 size][1 op][2 header size][header][payload]`
(big-endian; `size` counts what follows it): the header is a JSON object, the payload raw bytes
(a group's stored records, exactly as the leader wrote them, so replicas stay byte-identical).
A connection carries requests one way and answers the other, in order: each request gets one
`REPLY` (its header holds the answer) or one `ERROR` (`{"code": ..., "text": ...}` and what
the answerer wants known, such as its log's end).

Requests (every one names `topic` and `partition`; those a leader sends also its node ID as
`leader` and the partition's `epoch`, the write epoch a follower checks, so a deposed leader
cannot write):

* `PUT` (leader → follower): one group, `entry` (the 48-byte index entry's seven fields) and
  the records as payload. The follower writes it if it starts at its end.
* `CURSORS` (leader → follower): `channels`, each channel's confirmed position.
* `MATCH` (follower → leader): does an index entry of yours end at `offset`/`count`? Where a
  catching-up follower's log and its leader's part.
* `PULL` (follower → leader): entries from `offset` on (at most `max_entries`, `max_bytes`),
  their records as payload, and the leader's `end`; `E_OFFSET_OUT_OF_RANGE` when the leader's
  log does not hold `offset` (its retention removed it, or no group starts there).
* `START` (follower → leader): where the leader's log starts (`start`, its first `segment`
  number, the index entry `boundary` that ends there) and its producer snapshots at or after
  it (`snapshots`: offset and size of each, the files' bytes as payload): what a follower
  that cannot continue its own log starts over from.
* `JOIN` (follower → leader): `node`, caught up in `incarnation` at `end` (its last index
  entry `last`), asks to enter the ISR. The leader stops acknowledging writes, gives it what
  it wrote since (`PUT` with `admit`), has the master add it to the ISR, and answers with the
  replica info that holds it (`info`, its JSON, and `epoch`).
"""

import json
import struct
from typing import NamedTuple

PUT = 1
CURSORS = 2
MATCH = 3
PULL = 4
START = 5
JOIN = 6
REPLY = 0x80
ERROR = 0x81
OP_NAMES = {
    PUT: "PUT",
    CURSORS: "CURSORS",
    MATCH: "MATCH",
    PULL: "PULL",
    START: "START",
    JOIN: "JOIN",
    REPLY: "REPLY",
    ERROR: "ERROR",
}

_PREFIX = struct.Struct(">IBH")
# A frame larger than this is refused: a group is at most `--max-body-size`-ish, a pull is
# bounded by its `max_bytes`.
MAX_FRAME_SIZE = 64 * 1024 * 1024


class ReplicationProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


class Frame(NamedTuple):
    op: int
    header: dict
    payload: bytes


def encode_frame(op: int, header: dict, payload: bytes = b"") -> bytes:
    encoded = json.dumps(header, separators=(",", ":")).encode()
    size = 1 + 2 + len(encoded) + len(payload)
    return _PREFIX.pack(size, op, len(encoded)) + encoded + payload


class FrameReader:
    """Frames from a byte stream, fed as it comes."""

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self._buffer = bytearray()
        self._max = max_frame_size

    def receive_data(self, data: bytes | bytearray) -> list[Frame]:
        buffer = self._buffer
        buffer += data
        frames = []
        at = 0
        while len(buffer) - at >= 4:
            (size,) = struct.unpack_from(">I", buffer, at)
            if size < 3 or size > self._max:
                raise ReplicationProtocolError(f"a frame of {size} bytes")
            if len(buffer) - at - 4 < size:
                break
            _size, op, header_size = _PREFIX.unpack_from(buffer, at)
            if op not in OP_NAMES or 3 + header_size > size:
                raise ReplicationProtocolError(f"a frame with op {op}, header {header_size}")
            header_start = at + _PREFIX.size
            try:
                header = json.loads(bytes(buffer[header_start : header_start + header_size]))
            except ValueError as error:
                raise ReplicationProtocolError(f"a header that is not JSON: {error}") from None
            if not isinstance(header, dict):
                raise ReplicationProtocolError("a header that is not a JSON object")
            payload = bytes(buffer[header_start + header_size : at + 4 + size])
            frames.append(Frame(op, header, payload))
            at += 4 + size
        if at:
            del buffer[:at]
        return frames

    def unread(self) -> bytes:
        """What came after the last whole frame (the start of the next)."""
        return bytes(self._buffer)


class ReplicaRefusal(Exception):
    """An `ERROR` answer: `code` (Youzan's names where they exist, such as
    `E_FAILED_ON_NOT_LEADER`), `text`, and the rest of its header in `details`."""

    def __init__(self, header: dict) -> None:
        self.code = str(header.get("code", "E_INVALID"))
        self.text = str(header.get("text", ""))
        self.details = header
        super().__init__(f"{self.code} {self.text}".strip())


def error_header(code: str, text: str, **details) -> dict:
    return {"code": code, "text": text, **details}
