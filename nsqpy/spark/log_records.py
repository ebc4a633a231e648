"""Stored log records (nsqd's `/partition/fetch` body) as Arrow record batches.

A fetch returns the records of a partition exactly as nsqd stored them (docs/protocol.md §6.3):
`[4 size][8 timestamp ns][2 attempts][8 id][8 trace id][body]`, where an ext topic's records
flag `0xA` in the attempts' high nibble and put an ext section (`[1 version]`, and for version
4 `[2 length][header]`) before the body; the last record of an idempotent publish flags `0xC`
(or `0xE` with an ext section after it) and puts its producer (`[1 length][id][8 sequence]`)
there first. A delayed record flags `0x8` (`0x9` with an ext section after it) and puts
`[8 due ms][1 length][channel]` there: a DPUB (no channel) is read as the publish it is, and a
copy a channel moved to the end of its delay (a channel named) is left out, as its message was
read already. Offsets are virtual: a record's offset is the previous
record's plus its size prefix and size, the same on every replica.
"""

import json
import struct
from binascii import hexlify

import pyarrow as pa

_SIZED_HEADER = struct.Struct(">IqH8sQ")
_BODY_START = _SIZED_HEADER.size  # 30
_EXT_FLAG = 0xA000
_PRODUCER_FLAG = 0xC000
_PRODUCER_EXT_FLAG = 0xE000
_DELAYED_FLAG = 0x8000
_DELAYED_EXT_FLAG = 0x9000


# Kafka's timestampType of a timestamp the broker set when it stored the message: nsqd's.
LOG_APPEND_TIME = 1
# Kafka's `headers` column: an ext topic's JSON header, one entry a key, and the trace ID.
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TRACE_ID_HEADER = "##trace_id"


class RecordError(ValueError):
    """Bytes that are not whole records."""


def records_to_batch(
    data: bytes,
    first_offset: int,
    *,
    topic: str,
    partition: int,
    nsqd: str,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """One record batch of the source's schema from a fetch's body that starts at
    `first_offset`; columns are found by name, so their order is the schema's."""
    ids: list[bytes] = []
    bodies: list[bytes | memoryview] = []
    attempts_column: list[int] = []
    timestamps: list[int] = []
    offsets: list[int] = []
    with_headers = schema.get_field_index("headers") >= 0
    # The headers column as flat arrays (each record's entries from `header_ends[i]` to
    # `header_ends[i+1]`); a header is parsed once per batch, as messages repeat them.
    header_keys: list[str] = []
    header_values: list[bytes] = []
    header_ends = [0]
    parsed: dict[bytes, tuple[list[str], list[bytes]]] = {}
    unpack = _SIZED_HEADER.unpack_from
    view = memoryview(data)
    at, length = 0, len(data)
    while at < length:
        if at + _BODY_START > length:
            raise RecordError(f"a truncated record header at offset {first_offset + at}")
        size, timestamp, attempts, raw_id, trace_id = unpack(data, at)
        end = at + 4 + size
        if end > length or size < _BODY_START - 4:
            raise RecordError(f"a record of {size} bytes at offset {first_offset + at}")
        body_at = at + _BODY_START
        flag = attempts & 0xF000
        if flag:
            attempts &= 0x0FFF
        if flag in (_PRODUCER_FLAG, _PRODUCER_EXT_FLAG):
            body_at += 1 + data[body_at] + 8
        elif flag in (_DELAYED_FLAG, _DELAYED_EXT_FLAG):
            channel_length = data[body_at + 8]
            if channel_length:
                at = end
                continue
            body_at += 9
        header = b""
        if flag in (_EXT_FLAG, _PRODUCER_EXT_FLAG, _DELAYED_EXT_FLAG):
            version = data[body_at]
            body_at += 1
            if version == 4:
                header_length = int.from_bytes(data[body_at : body_at + 2], "big")
                if with_headers:
                    header = data[body_at + 2 : body_at + 2 + header_length]
                body_at += 2 + header_length
        if with_headers:
            entries = parsed.get(header)
            if entries is None:
                entries = parsed[header] = _header_entries(header)
            header_keys += entries[0]
            header_values += entries[1]
            if trace_id and TRACE_ID_HEADER not in entries[0]:
                header_keys.append(TRACE_ID_HEADER)
                header_values.append(str(trace_id).encode())
            header_ends.append(len(header_keys))
        ids.append(raw_id)
        bodies.append(view[body_at:end])
        attempts_column.append(attempts)
        timestamps.append(timestamp // 1000)
        offsets.append(first_offset + at)
        at = end
    rows = len(ids)
    columns = {
        "id": pa.array([hexlify(raw).decode() for raw in ids], pa.string()),
        "body": pa.array(bodies, pa.binary()),
        "attempts": pa.array(attempts_column, pa.int32()),
        "timestamp": pa.array(timestamps, pa.int64()),
        "topic": pa.repeat(pa.scalar(topic, pa.string()), rows),
        "nsqd": pa.repeat(pa.scalar(nsqd, pa.string()), rows),
        "partition": pa.repeat(pa.scalar(partition, pa.int32()), rows),
        "offset": pa.array(offsets, pa.int64()),
        "timestampType": pa.repeat(pa.scalar(LOG_APPEND_TIME, pa.int32()), rows),
    }
    if with_headers:
        entries_array = pa.StructArray.from_arrays(
            [pa.array(header_keys, pa.string()), pa.array(header_values, pa.binary())],
            fields=list(HEADERS_TYPE.value_type),
        )
        columns["headers"] = pa.ListArray.from_arrays(
            pa.array(header_ends, pa.int32()), entries_array, type=HEADERS_TYPE
        )
    arrays = [columns[field.name].cast(field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _header_entries(header: bytes) -> tuple[list[str], list[bytes]]:
    """An ext header's entries as Kafka's (key, value bytes): a string as its UTF-8, anything
    else as its JSON; none for a header that is not a JSON object."""
    keys: list[str] = []
    values: list[bytes] = []
    if header:
        try:
            document = json.loads(header)
        except ValueError:
            document = None
        if isinstance(document, dict):
            for key, value in document.items():
                keys.append(key)
                values.append((value if isinstance(value, str) else json.dumps(value)).encode())
    return keys, values
