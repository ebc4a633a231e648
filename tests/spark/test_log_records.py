"""The Spark source's reader of stored records (`nsqpy/spark/log_records.py`) against records
the partition log wrote, its ext and producer sections included."""

import json
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from nsqpy.nsqd.message import Message
from nsqpy.partition_log import PartitionLog, Position, ProducerMark
from nsqpy.spark.log_records import (
    RecordError,
    _bulk_columns,
    _header_table,
    _header_table_by_shape,
    _header_table_in_bulk,
    _header_table_of_one_shape,
    _record_columns,
    records_to_batch,
)
from nsqpy.spark.source import SCHEMA as SPARK_SCHEMA

SCHEMA = pa.schema([("body", pa.binary()), ("offset", pa.int64()), ("attempts", pa.int32())])


@pytest.mark.parametrize("ext", [False, True])
def test_bodies_come_without_the_producer_and_ext_sections(tmp_path, ext):
    log = PartitionLog(
        str(tmp_path),
        "t",
        0,
        message_type=Message,
        max_bytes_per_file=1 << 20,
        sync_every=1,
        ext=ext,
    )
    bodies = (b"a", b"bb", b"ccc")
    messages = [Message(mid, body, 5) for mid, body in zip(log.next_ids(3), bodies, strict=True)]
    messages[2].ext_header = b'{"k":"v"}'
    log.append(messages[:1])
    log.append(messages[1:], ProducerMark(b"spark-q-b1-p0", 41))
    log.commit()
    data, _end = log.read_raw(Position(0, 0), log.end.offset, 1 << 20)
    batch = records_to_batch(data, 0, topic="t", partition=0, nsqd="n", schema=SCHEMA)
    assert batch.column("body").to_pylist() == list(bodies)
    assert batch.column("offset").to_pylist() == [m.offset for m in messages]
    assert batch.column("attempts").to_pylist() == [0, 0, 0]
    log.close()


def stored_records(messages) -> bytes:
    """Stored records: (timestamp ns, attempts, id, trace id, ext section or None, body,
    producer or None) each; an ext section is `[1 version]` and, for version 4,
    `[2 length][json]`; a producer `(id, sequence)` marks the last record of a publish."""
    parts = []
    for timestamp, attempts, raw_id, trace_id, ext, body, *mark in messages:
        producer = mark[0] if mark else None
        flag = (0xA000 if producer is None else 0xE000) if ext else 0
        if producer is not None and not ext:
            flag = 0xC000
        rest = struct.pack(">qH8sQ", timestamp, attempts | flag, raw_id, trace_id)
        if producer is not None:
            rest += bytes([len(producer[0])]) + producer[0] + producer[1].to_bytes(8, "big")
        rest += (ext or b"") + body
        parts.append(len(rest).to_bytes(4, "big") + rest)
    return b"".join(parts)


def ext_section(version: int, header: dict) -> bytes:
    if version != 4:
        return bytes([version])
    raw = json.dumps(header).encode()
    return b"\x04" + len(raw).to_bytes(2, "big") + raw


FULL_SCHEMA = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
RECORDS = st.lists(
    st.tuples(
        st.integers(0, 1 << 62),
        st.integers(0, 0x0FFF),
        st.binary(min_size=8, max_size=8),
        st.sampled_from([0, 0, 77, (1 << 64) - 1]),
        st.one_of(
            st.none(),
            st.builds(
                ext_section,
                st.sampled_from([0, 4]),
                st.dictionaries(
                    st.sampled_from(["##client_dispatch_tag", "k", "##trace_id"]),
                    st.sampled_from(["a", "5", ""]),
                    max_size=2,
                ),  # fmt: skip
            ),
        ),
        st.binary(max_size=40),
        st.one_of(
            st.none(),
            st.tuples(st.binary(min_size=1, max_size=64), st.integers(0, (1 << 63) - 1)),
        ),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(RECORDS, st.integers(0, 1 << 40), st.booleans())
def test_a_fetch_in_bulk_reads_as_record_by_record(messages, first_offset, with_headers):
    """The bulk conversion of a fetch of plain and ext records gives every column the
    record-by-record path gives, the headers column included."""
    data = stored_records(messages)
    bulk = _bulk_columns(data, first_offset, with_headers)
    assert bulk is not None
    one_by_one = _record_columns(data, first_offset, with_headers)
    assert set(bulk) == set(one_by_one)
    for name, column in bulk.items():
        assert column.equals(one_by_one[name]), name
    assert bulk["id"].to_pylist() == [message[2].hex() for message in messages]


_KEYS = st.sampled_from(["##client_dispatch_tag", "##trace_id", "k", "é", 'q"uote', ""])
_VALUES = st.one_of(
    st.text(max_size=6),
    _KEYS,
    st.sampled_from(["line\nbreak", "nullable", "2024-01-01"]),
    st.none(),
    st.integers(-5, 5),
    st.just({"nested": "x"}),
)
_STRING_VALUES = st.one_of(st.text(max_size=6), st.just("line\nbreak"))
# Values JSON writes without escapes.
_PLAIN_VALUES = st.text(
    st.characters(blacklist_characters='"\\', blacklist_categories=("Cc", "Cs")), max_size=6
)
# As Youzan's clients write headers: string values.
_STRING_HEADER = st.builds(
    lambda entries, indent: json.dumps(entries, ensure_ascii=False, indent=indent).encode(),
    st.dictionaries(_KEYS, _STRING_VALUES, max_size=4),
    st.sampled_from([None, None, 1]),
)
_HEADER = st.one_of(
    st.builds(
        lambda entries, ascii_only, indent: json.dumps(
            entries, ensure_ascii=ascii_only, indent=indent
        ).encode(),
        st.dictionaries(_KEYS, _VALUES, max_size=4),
        st.booleans(),
        st.sampled_from([None, None, 1]),
    ),
    st.sampled_from([b"", b"[1]", b'"text"', b"{", b'{"a":"1"} {"b":"2"}', b"\xff"]),
)


def _table_as_lists(table) -> tuple:
    counts, named, keys, values = table
    return counts.tolist(), named.tolist(), keys.to_pylist(), values.to_pylist()


@settings(max_examples=200, deadline=None)
@given(st.lists(_STRING_HEADER, min_size=1, max_size=12) | st.lists(_HEADER, max_size=12))
# A key's quoted text inside an earlier value: `""` in `"\""` is not the key "".
@example([b'{"##client_dispatch_tag": "\\"", "##trace_id": "line\\nbreak", "": "0"}'])
def test_headers_parsed_in_bulk_read_as_one_by_one(headers):
    """The headers of the first one's shape cut apart by a regular expression, the others
    read by Arrow's JSON reader: each header's entries as `json.loads` gives them, in the
    header's order (the JSON reader may decline, and the caller parses one by one)."""
    distinct = pa.array(list(dict.fromkeys([b"{}", *headers])), pa.binary())
    one_by_one = _table_as_lists(_header_table(distinct))
    assert _table_as_lists(_header_table_by_shape(distinct)) == one_by_one
    in_bulk = _header_table_in_bulk(distinct)
    if in_bulk is not None:
        assert _table_as_lists(in_bulk) == one_by_one


def test_a_header_per_message_is_parsed_in_bulk():
    """The usual case of many distinct headers (a trace ID or a business key in each, keys
    in any order) takes the bulk path."""
    headers = [
        json.dumps({"##client_dispatch_tag": "blue", "##trace_id": str(n)}).encode()
        if n % 2
        else json.dumps({"order": f"o-{n}", "##client_dispatch_tag": "red"}).encode()
        for n in range(100)
    ]
    distinct = pa.array([*headers, b""], pa.binary())
    one_by_one = _table_as_lists(_header_table(distinct))
    assert _table_as_lists(_header_table_by_shape(distinct)) == one_by_one
    in_bulk = _header_table_in_bulk(distinct)
    assert in_bulk is not None
    assert _table_as_lists(in_bulk) == one_by_one


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_headers_of_one_shape_read_as_one_by_one(data):
    """Headers one producer wrote (the same keys, order and spacing, values of any text) are
    cut apart record by record as `json.loads` reads them, or declined (a value written with
    escapes, a header of another shape), from any slice of an array."""
    keys = data.draw(st.lists(_KEYS, unique=True, min_size=1, max_size=3))
    indent = data.draw(st.sampled_from([None, 1]))
    text = data.draw(st.sampled_from([_PLAIN_VALUES, _PLAIN_VALUES, _STRING_VALUES]))
    values = st.lists(text, min_size=len(keys), max_size=len(keys))
    headers = [
        json.dumps(dict(zip(keys, row, strict=True)), ensure_ascii=False, indent=indent).encode()
        for row in data.draw(st.lists(values, min_size=1, max_size=12))
    ]
    headers += data.draw(st.sampled_from([[], [], [b'{"x": "y"}']]) | st.lists(_HEADER, max_size=2))
    skipped = data.draw(st.integers(0, 2))
    array = pa.array([b'{"x": "y"}'] * skipped + headers, pa.binary())[skipped:]
    one_shape = _header_table_of_one_shape(array)
    if one_shape is not None:
        assert _table_as_lists(one_shape) == _table_as_lists(_header_table(array))


@pytest.mark.parametrize("key", ["##trace_id", "order"])
def test_a_header_per_message_of_one_producer_is_cut_apart_where_it_lies(key):
    """A fetch whose every record has its own header, written by one producer, reads its
    headers without a dictionary, and as record by record (the trace ID an entry of its
    own where the header does not name one)."""
    headers = [
        json.dumps({"##client_dispatch_tag": "é", key: str(n)}, ensure_ascii=False).encode()
        for n in range(100)
    ]
    messages = [
        (n, 1, n.to_bytes(8, "big"), n + 1, b"\x04" + len(raw).to_bytes(2, "big") + raw, b"b")
        for n, raw in enumerate(headers)
    ]
    assert _header_table_of_one_shape(pa.array(headers, pa.binary())) is not None
    data = stored_records(messages)
    bulk = _bulk_columns(data, 0, True)
    assert bulk is not None
    assert bulk["headers"].equals(_record_columns(data, 0, True)["headers"])
    entries = [
        {"key": "##client_dispatch_tag", "value": "é".encode()},
        {"key": key, "value": b"7"},
    ]
    if key != "##trace_id":
        entries.append({"key": "##trace_id", "value": b"8"})
    assert bulk["headers"][7].as_py() == entries


def test_a_fetch_with_a_delayed_record_is_read_record_by_record(tmp_path):
    """A delayed record (a DPUB's, or a copy moved to a channel's delay) is not for the bulk
    path; a DPUB reads as the publish it is."""
    dpub = struct.pack(">qH8sQ", 5, 0x8000, b"12345678", 0) + (9).to_bytes(8, "big") + b"\x00"
    data = (len(dpub) + 4).to_bytes(4, "big") + dpub + b"late"
    assert _bulk_columns(data, 0, False) is None
    batch = records_to_batch(data, 0, topic="t", partition=0, nsqd="n", schema=FULL_SCHEMA)
    assert batch.column("body").to_pylist() == [b"late"]


@pytest.mark.parametrize("cut", [1, 3, 31, 40])
def test_bytes_that_are_not_whole_records_say_where(cut):
    data = stored_records(
        [
            (1, 1, b"12345678", 0, None, b"body", None),
            (2, 1, b"87654321", 0, None, b"next body", None),
        ]
    )
    where = {"topic": "t", "partition": 0, "nsqd": "n", "schema": FULL_SCHEMA}
    with pytest.raises(RecordError, match="at offset 10"):
        records_to_batch(data[:-cut], 1000, **where)


def test_the_record_starts_nsqd_found_give_the_batch_of_walking_the_records(tmp_path):
    """`read_raw(starts=...)` (what `/partition/fetch?starts=true` sends ahead of the records)
    across rolled segments, ext sections and producer marks: the batch built from those starts
    is the batch built by walking the size prefixes; starts that are not the records' are
    checked, and the records walked instead."""
    log = PartitionLog(
        str(tmp_path),
        "t",
        0,
        message_type=Message,
        max_bytes_per_file=300,
        sync_every=1,
        ext=True,
    )
    for number in range(12):
        messages = [Message(mid, b"body %d" % number, 5) for mid in log.next_ids(3)]
        messages[1].ext_header = json.dumps({"##trace_id": str(number)}).encode()
        log.append(messages, ProducerMark(b"p", number) if number % 2 else None)
        log.commit()
    starts: list[int] = []
    data, _end = log.read_raw(Position(0, 0), log.end.offset, 1 << 20, starts=starts)
    log.close()
    assert len(log.segments) > 1 and len(starts) == 36
    where = {"topic": "t", "partition": 0, "nsqd": "n", "schema": FULL_SCHEMA}
    walked = records_to_batch(data, 0, **where)
    known = np.array(starts, dtype=">u4")
    assert records_to_batch(data, 0, starts=known, **where).equals(walked)
    inside = known.copy()
    inside[5] += 1  # ascending, within the data, but not where a record starts
    for wrong in (known[1:], np.roll(known, 1), known + 1, np.zeros(36, dtype=">u4"), inside):
        assert _bulk_columns(data, 0, True, wrong) is None
        assert records_to_batch(data, 0, starts=wrong, **where).equals(walked)
