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

A fetch without delayed records (most fetches) is converted column by column with numpy:
Python only walks the size prefixes, and the fields, the hex IDs, the bodies and the headers
are gathered in bulk (a header is parsed once per fetch). Delayed records take the record-by-
record path, which also says what is wrong with bytes that are not whole records.
"""

import json
import re
import struct
from binascii import hexlify

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

_SIZED_HEADER = struct.Struct(">IqH8sQ")
_SIZE = struct.Struct(">I")
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
    starts: np.ndarray | None = None,
) -> pa.RecordBatch:
    """One record batch of the source's schema from a fetch's body that starts at
    `first_offset` (`starts`: where each record starts in it, as nsqd found them); columns
    are found by name, so their order is the schema's."""
    with_headers = schema.get_field_index("headers") >= 0
    columns = _bulk_columns(data, first_offset, with_headers, starts)
    if columns is None:
        columns = _record_columns(data, first_offset, with_headers)
    rows = len(columns["id"])
    columns["topic"] = pa.repeat(pa.scalar(topic, pa.string()), rows)
    columns["nsqd"] = pa.repeat(pa.scalar(nsqd, pa.string()), rows)
    columns["partition"] = pa.repeat(pa.scalar(partition, pa.int32()), rows)
    columns["timestampType"] = pa.repeat(pa.scalar(LOG_APPEND_TIME, pa.int32()), rows)
    if schema.get_field_index("value") >= 0:
        columns["value"] = columns["body"]
    arrays = [columns[field.name].cast(field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _bulk_columns(
    data: bytes, first_offset: int, with_headers: bool, known_starts: np.ndarray | None = None
) -> dict | None:
    """The columns of a fetch of whole records, plain, ext or with producer marks (no
    delayed record), gathered in bulk; None for anything else. `known_starts`: where each
    record starts, checked against the records' sizes instead of walking them."""
    length = len(data)
    if not length or length >= 1 << 31:
        return None
    buffer = np.frombuffer(data, dtype=np.uint8)
    first = _record_starts(data, known_starts)
    if first is None:
        return None

    def gather(offset: int, width: int, kind: str, rows: np.ndarray = first) -> np.ndarray:
        """The big-endian field at `offset` from each of `rows` (positions in `data`)."""
        return buffer[(rows + offset)[:, None] + np.arange(width)].view(kind).ravel()

    sizes = gather(0, 4, ">u4").astype(np.int64)
    ends = first + 4 + sizes
    if (sizes < _BODY_START - 4).any():
        return None
    if known_starts is not None and ((ends[:-1] != first[1:]).any() or ends[-1] != length):
        return None  # not where the records start: walked one by one instead
    attempts = gather(12, 2, ">u2")
    flags = attempts & 0xF000
    body_starts = first + _BODY_START
    header_bounds = None
    if flags.any():
        producer = (flags == _PRODUCER_FLAG) | (flags == _PRODUCER_EXT_FLAG)
        ext = (flags == _EXT_FLAG) | (flags == _PRODUCER_EXT_FLAG)
        if not (producer | ext | (flags == 0)).all():
            return None  # delayed records
        if producer.any():
            # The producer mark first: `[1 length][producer id][8 sequence]`.
            if (ends[producer] <= body_starts[producer]).any():
                return None
            marks = buffer[np.where(producer, body_starts, 0)].astype(np.int64)
            body_starts = body_starts + producer * (1 + marks + 8)
        # The ext section: `[1 version]`, and for version 4 `[2 length][header]`.
        if (ends[ext] <= body_starts[ext]).any():
            return None
        with_header = np.zeros(len(first), dtype=bool)
        with_header[ext] = buffer[body_starts[ext]] == 4
        if (ends[with_header] < body_starts[with_header] + 3).any():
            return None
        lengths = np.zeros(len(first), dtype=np.int64)
        lengths[with_header] = gather(1, 2, ">u2", body_starts[with_header])
        # Records without a header have an empty one where their body starts.
        header_starts = body_starts + 3 * with_header
        header_bounds = (header_starts, header_starts + lengths * with_header)
        body_starts = body_starts + ext + (2 + lengths) * with_header
        if (body_starts > ends).any():
            return None
        attempts = attempts & 0x0FFF
    count = len(first)
    hex_ids = buffer[first[:, None] + (14 + np.arange(8))].tobytes().hex().encode()
    columns = {
        "id": pa.StringArray.from_buffers(
            count,
            pa.py_buffer(np.arange(0, 16 * count + 1, 16, dtype=np.int32)),
            pa.py_buffer(hex_ids),
        ),
        "body": _slices(data, body_starts, ends),
        "attempts": pa.array(attempts.astype(np.int32)),
        "timestamp": pa.array(gather(4, 8, ">i8") // 1000),
        "offset": pa.array(first + first_offset),
    }
    if with_headers:
        raw = (
            pa.array([b""] * count, pa.binary())
            if header_bounds is None
            else _slices(data, *header_bounds)
        )
        columns["headers"] = _bulk_headers(raw, gather(22, 8, ">u8").astype(np.uint64))
    return columns


def _record_starts(data: bytes, known: np.ndarray | None) -> np.ndarray | None:
    """Where each record of `data` starts: `known` (each checked by the caller) or found by
    walking the size prefixes; None when the last record is cut short."""
    length = len(data)
    if known is not None:
        first = known.astype(np.int64)
        if not len(first) or first[0] != 0 or first[-1] + 4 > length:
            return None
        if (first[1:] <= first[:-1]).any():
            return None  # each inside `data` only when they ascend
        return first
    starts: list[int] = []
    append = starts.append
    size_of = _SIZE.unpack_from
    at = 0
    try:
        while at < length:
            append(at)
            at += 4 + size_of(data, at)[0]
    except struct.error:
        return None  # a truncated size prefix
    if at != length:
        return None  # a truncated record
    return np.array(starts, dtype=np.int64)


def _bulk_headers(raw: pa.Array, trace_ids: np.ndarray) -> pa.Array:
    """The `headers` column of records whose JSON headers are `raw`: each distinct header is
    parsed once, and each record's entries are its header's, then `##trace_id` when the
    record has a trace ID its header does not name."""
    # A header per record (its own trace ID or business key) is worth no dictionary: such
    # headers are cut apart where they lie when one producer wrote them all.
    each = None
    if len(raw) > _PARSED_ONE_BY_ONE and raw[0] != raw[-1]:
        each = _header_table_of_one_shape(raw)
    if each is not None:
        counts, named, keys, values = each
        traced = (trace_ids != 0) & ~named
        if not traced.any():
            ends = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
            entries = pa.StructArray.from_arrays(
                [keys, values], fields=list(HEADERS_TYPE.value_type)
            )
            return pa.ListArray.from_arrays(pa.array(ends), entries, type=HEADERS_TYPE)
        which = np.arange(len(raw), dtype=np.int64)
    else:
        encoded = pc.dictionary_encode(raw)
        distinct = encoded.dictionary
        if len(distinct) > _PARSED_ONE_BY_ONE:
            table = _header_table_by_shape(distinct)
        else:
            table = _header_table(distinct)
        counts, named, keys, values = table
        which = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    # The distinct headers' entries one after another, then the trace IDs' entries.
    table_starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    traced = (trace_ids != 0) & ~named[which]
    row_counts = counts[which] + traced
    ends = np.concatenate(([0], np.cumsum(row_counts))).astype(np.int32)
    total = int(ends[-1])
    # For every entry of the column, the entry of the table it is: a record's header's
    # entries in order, and its trace ID's last.
    source = np.empty(total, dtype=np.int64)
    base = counts[which]
    within = np.arange(int(base.sum())) - np.repeat(np.cumsum(base) - base, base)
    row_of_entry = np.repeat(np.arange(len(which)), base)
    source[ends[:-1][row_of_entry] + within] = table_starts[which][row_of_entry] + within
    table_size = int(counts.sum())
    source[ends[1:][traced] - 1] = table_size + np.arange(int(traced.sum()))
    trace_values = pa.array(trace_ids[traced]).cast(pa.string()).cast(pa.binary())
    key_table = pa.concat_arrays([keys, pa.repeat(pa.scalar(TRACE_ID_HEADER), len(trace_values))])
    value_table = pa.concat_arrays([values, trace_values])
    order = pa.array(source)
    entries = pa.StructArray.from_arrays(
        [key_table.take(order), value_table.take(order)], fields=list(HEADERS_TYPE.value_type)
    )
    return pa.ListArray.from_arrays(pa.array(ends), entries, type=HEADERS_TYPE)


# Up to this many distinct headers in a fetch are parsed one by one (`json.loads`); more (a
# header per message, as a trace ID or a business key makes them) are parsed by Arrow's JSON
# reader in one call.
_PARSED_ONE_BY_ONE = 32

# The distinct headers' entries: per header how many and whether one is `##trace_id`, then
# every header's keys (string) and values (binary), one header after the other.
_HeaderTable = tuple[np.ndarray, np.ndarray, pa.Array, pa.Array]


def _header_table(headers: pa.Array) -> _HeaderTable:
    """The entries of `headers`, parsed one by one."""
    parsed = [_header_entries(header) for header in headers.to_pylist()]
    counts = np.array([len(keys) for keys, _values in parsed], dtype=np.int64)
    named = np.array([TRACE_ID_HEADER in keys for keys, _values in parsed], dtype=bool)
    keys = [key for header_keys, _values in parsed for key in header_keys]
    values = [value for _keys, header_values in parsed for value in header_values]
    return counts, named, pa.array(keys, pa.string()), pa.array(values, pa.binary())


# JSON's whitespace, and a string without escapes (nor the control characters JSON forbids).
_SPACE = "[ \\t\\n\\r]*"
_PLAIN_VALUE = '(?P<v%d>[^"\\\\\\x00-\\x1f]*)'
_PLAIN_STRING = f'"{_PLAIN_VALUE}"'


def _header_table_by_shape(headers: pa.Array) -> _HeaderTable:
    """The entries of many distinct headers. Most share one shape (the same keys in the same
    order, each value a string without escapes: a trace ID or a business key is what
    differs): those are cut apart by one regular expression; the rest are read by Arrow's
    JSON reader, or one by one."""
    lengths = pc.binary_length(headers).to_numpy(zero_copy_only=False)
    shape = _shape_of(headers[int(np.argmax(lengths > 0))].as_py())
    try:
        text = headers.cast(pa.string())
    except pa.ArrowInvalid:
        shape = None  # not UTF-8
    if shape is None:
        return _header_table_in_bulk(headers) or _header_table(headers)
    keys, pieces = shape
    cut = pc.extract_regex(text, _pattern_of(pieces))
    matched = cut.is_valid().to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(matched)
    width = len(keys)
    # Row by row, each row's values in the shape's order.
    values = pa.concat_arrays([cut.field(f"v{n}").filter(matched) for n in range(width)])
    by_row = np.arange(width * len(rows)).reshape(width, len(rows)).T.ravel()
    parts = [
        (
            np.repeat(rows, width),
            pa.array(keys, pa.string()).take(pa.array(np.tile(np.arange(width), len(rows)))),
            values.take(pa.array(by_row)).cast(pa.binary()),
        )
    ]
    named = np.zeros(len(headers), dtype=bool)
    named[rows] = TRACE_ID_HEADER in keys
    others = np.flatnonzero(~matched)
    if len(others):
        rest = headers.take(pa.array(others))
        table = (
            _header_table_in_bulk(rest) if len(rest) > _PARSED_ONE_BY_ONE else None
        ) or _header_table(rest)
        parts.append((np.repeat(others, table[0]), table[2], table[3]))
        named[others] = table[1]
    entry_rows = np.concatenate([part[0] for part in parts])
    order = pa.array(np.argsort(entry_rows, kind="stable"))
    return (
        np.bincount(entry_rows, minlength=len(headers)).astype(np.int64),
        named,
        pa.concat_arrays([part[1] for part in parts]).take(order),
        pa.concat_arrays([part[2] for part in parts]).take(order),
    )


def _shape_of(header: bytes) -> tuple[list[str], list[str]] | None:
    """The keys of `header` and the text around its values, strings without escapes: the
    pieces before the first value, between each two and after the last (so a header of this
    shape is `pieces[0] + v0 + pieces[1] + v1 + ... + pieces[-1]`); None for a header of no
    such shape. (The same keys and spacing throughout: one producer's headers, which is what
    a fetch usually holds.)"""
    try:
        document = json.loads(header)
        text = header.decode()
    except ValueError:
        return None
    if not isinstance(document, dict) or not document:
        return None
    if not all(isinstance(value, str) for value in document.values()):
        return None
    entries = [
        f"{re.escape(json.dumps(key, ensure_ascii=False))}{_SPACE}:{_SPACE}{_PLAIN_STRING % n}"
        for n, key in enumerate(document)
    ]
    separator = f"{_SPACE},{_SPACE}"
    written = re.fullmatch(
        f"{_SPACE}\\{{{_SPACE}{separator.join(entries)}{_SPACE}\\}}{_SPACE}", text
    )
    if written is None:
        return None  # a key written with escapes, or a value with them
    pieces, at = [], 0
    for n in range(len(document)):
        pieces.append(text[at : written.start(f"v{n}")])
        at = written.end(f"v{n}")
    pieces.append(text[at:])
    return list(document), pieces


def _pattern_of(pieces: list[str]) -> str:
    """The regular expression of the headers written as `pieces` around plain string values
    (a literal pattern is a third faster to match than one that allows any spacing)."""
    values = [_PLAIN_VALUE % n for n in range(len(pieces) - 1)]
    between = [re.escape(piece) for piece in pieces]
    return "^" + "".join(p + v for p, v in zip(between, [*values, ""], strict=True)) + "$"


def _header_table_of_one_shape(headers: pa.Array) -> _HeaderTable | None:
    """The entries of `headers`, one table row a header (no dictionary), when every one is
    written as the first is but for its values (strings without escapes): each value ends
    at the first quote after where the text before it ends, so Arrow's vectorized search
    and comparison find them all; None when a header is written otherwise."""
    if not len(headers) or headers.null_count:
        return None
    shape = _shape_of(headers[0].as_py())
    if shape is None:
        return None
    keys, pieces = shape
    width = len(keys)
    rows = len(headers)
    _validity, offsets_buffer, data_buffer = headers.buffers()
    bounds = np.frombuffer(offsets_buffer, dtype=np.int32)[
        headers.offset : headers.offset + rows + 1
    ].astype(np.int64)
    header_starts, header_ends = bounds[:-1], bounds[1:]
    # Piece by piece: where it lies follows from where the value before it ends, the first
    # quote after the value's start (the next piece starts with the value's closing quote).
    value_starts = np.empty((rows, width), dtype=np.int64)
    value_ends = np.empty((rows, width), dtype=np.int64)
    at = header_starts
    for number, piece in enumerate(pieces):
        written = piece.encode()
        if number == width:
            if (header_ends - at != len(written)).any():
                return None
        elif (at + len(written) > header_ends).any():
            return None
        if not _all_written(data_buffer, at, at + len(written), written):
            return None
        if number == width:
            break
        at = value_starts[:, number] = at + len(written)
        found = pc.find_substring(_spans(data_buffer, at, header_ends), '"')
        closing = found.to_numpy(zero_copy_only=False)[0::2].astype(np.int64)
        if (closing < 0).any():
            return None
        at = value_ends[:, number] = at + closing
    values = _slices(data_buffer, value_starts.ravel(), value_ends.ravel())
    # No escape nor control character in a value (JSON reads them otherwise).
    _validity, value_bounds, value_bytes = values.buffers()
    written_values = np.frombuffer(value_bytes, dtype=np.uint8)
    written_values = written_values[: np.frombuffer(value_bounds, dtype=np.int32)[-1]]
    if ((written_values == _BACKSLASH) | (written_values < 0x20)).any():
        return None
    try:
        values.cast(pa.string())
    except pa.ArrowInvalid:
        return None  # not UTF-8
    written_keys = [key.encode() for key in keys]
    key_bounds = np.cumsum([0] + [len(key) for key in written_keys])
    key_offsets = (key_bounds[-1] * np.arange(rows)[:, None] + key_bounds[1:]).ravel()
    key_column = pa.StringArray.from_buffers(
        rows * width,
        pa.py_buffer(np.concatenate(([0], key_offsets)).astype(np.int32)),
        pa.py_buffer(b"".join(written_keys) * rows),
    )
    return (
        np.full(rows, width, dtype=np.int64),
        np.full(rows, TRACE_ID_HEADER in keys),
        key_column,
        values,
    )


_BACKSLASH = ord("\\")


def _header_table_in_bulk(headers: pa.Array) -> _HeaderTable | None:
    """The entries of `headers` (JSON objects of string values, as Youzan's clients write
    them) parsed by Arrow's JSON reader in one call, each header's in the order its keys
    first appear in it; None where that reading could differ from `_header_entries` (a value
    that is not a string or is `null`, a key written with escapes, bytes that are not one
    JSON object a header), for the caller to parse them one by one."""
    try:
        text = headers.cast(pa.string())
    except pa.ArrowInvalid:
        return None  # not UTF-8
    if pc.any(pc.match_substring(text, "null")).as_py():
        return None  # maybe a `null` value, which Arrow reads as no entry
    # One header a line: an empty one is no entry, and a raw line break (whitespace in JSON)
    # would end it.
    if pc.min(pc.binary_length(text)).as_py() == 0:
        text = pc.if_else(pc.equal(pc.binary_length(text), 0), "{}", text)
    document = _joined_lines(text)
    bytes_ = np.frombuffer(document, dtype=np.uint8)
    if np.count_nonzero(bytes_ == 10) != len(text) - 1 or (bytes_ == 13).any():
        document = _joined_lines(pc.replace_substring_regex(text, "[\\r\\n]", " "))
    try:
        table = pa_json.read_json(
            pa.BufferReader(document),
            read_options=pa_json.ReadOptions(
                use_threads=False, block_size=max(document.size + 1, 1 << 20)
            ),
            parse_options=pa_json.ParseOptions(newlines_in_values=False),
        )
    except pa.ArrowInvalid:
        return None
    if table.num_rows != len(headers):
        return None
    names = pa.array(table.column_names, pa.string())
    columns = [column.combine_chunks() for column in table.columns]
    if not all(pa.types.is_string(column.type) for column in columns):
        return None  # `_header_entries` gives anything else as its JSON
    # A value that is a key's name would be found as that key.
    ordered = len(columns) > 1
    if ordered and any(pc.any(pc.is_in(column, names)).as_py() for column in columns):
        return None
    rows_of, places_of, keys_of, values_of = [], [], [], []
    for key_number, (key, column) in enumerate(zip(table.column_names, columns, strict=True)):
        present = column.is_valid().to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(present)
        if ordered:
            # Where the key is written as one, after `{` or `,`: its quoted text alone may
            # also be inside an earlier value (`"\""` holds `""`), where no quote follows a
            # `{` or a `,` unescaped.
            written = re.escape(json.dumps(key, ensure_ascii=False))
            places = pc.find_substring_regex(text, f"[{{,]{_SPACE}{written}{_SPACE}:")
            places = places.to_numpy(zero_copy_only=False)
            if ((places >= 0) != present).any():
                return None  # a key its JSON writes with escapes
            places_of.append(places[rows])
        rows_of.append(rows)
        keys_of.append(np.full(len(rows), key_number, dtype=np.int64))
        values_of.append(column.drop_null())
    if not rows_of:
        nothing = np.zeros(len(headers), dtype=np.int64)
        return nothing, nothing.astype(bool), pa.array([], pa.string()), pa.array([], pa.binary())
    rows = np.concatenate(rows_of)
    order = np.lexsort((np.concatenate(places_of), rows)) if ordered else np.argsort(rows)
    key_numbers = np.concatenate(keys_of)[order]
    values = pa.concat_arrays(values_of).take(pa.array(order)).cast(pa.binary())
    counts = np.bincount(rows, minlength=len(headers)).astype(np.int64)
    named = np.zeros(len(headers), dtype=bool)
    if TRACE_ID_HEADER in table.column_names:
        named = table.column(TRACE_ID_HEADER).is_valid().to_numpy(zero_copy_only=False)
    return counts, named, names.take(pa.array(key_numbers)), values


def _joined_lines(text: pa.Array) -> pa.Buffer:
    """The strings of `text` one a line."""
    joined = pc.binary_join(pa.ListArray.from_arrays([0, len(text)], text), "\n")[0]
    return joined.as_buffer()


def _slices(data: bytes | pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """`data[starts[i]:ends[i]]` for each i (in order, not overlapping) as one binary array
    of its own."""
    return _spans(data, starts, ends).take(pa.array(np.arange(0, 2 * len(starts) - 1, 2)))


def _spans(data: bytes | pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """A binary array over `data` whose even values are `data[starts[i]:ends[i]]` (in order,
    not overlapping) and odd values what lies between them; no byte is copied."""
    count = len(starts)
    bounds = np.empty(2 * count, dtype=np.int32)
    bounds[0::2] = starts
    bounds[1::2] = ends
    return pa.BinaryArray.from_buffers(
        pa.binary(), 2 * count - 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)]
    )


def _all_written(data: pa.Buffer, starts: np.ndarray, ends: np.ndarray, text: bytes) -> bool:
    """Whether every `data[starts[i]:ends[i]]` is `text`."""
    if not text:
        return True
    same = pc.equal(_spans(data, starts, ends), pa.scalar(text, pa.binary()))
    return bool(same.to_numpy(zero_copy_only=False)[0::2].all())


def _record_columns(data: bytes, first_offset: int, with_headers: bool) -> dict:
    """The columns record by record: producer marks, delayed records, and bytes that are
    not whole records (RecordError)."""
    ids: list[bytes] = []
    bodies: list[bytes | memoryview] = []
    attempts_column: list[int] = []
    timestamps: list[int] = []
    offsets: list[int] = []
    headers: list[bytes] = []
    trace_ids: list[int] = []
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
            headers.append(header)
            trace_ids.append(trace_id)
        ids.append(raw_id)
        bodies.append(view[body_at:end])
        attempts_column.append(attempts)
        timestamps.append(timestamp // 1000)
        offsets.append(first_offset + at)
        at = end
    columns = {
        "id": pa.array([hexlify(raw).decode() for raw in ids], pa.string()),
        "body": pa.array(bodies, pa.binary()),
        "attempts": pa.array(attempts_column, pa.int32()),
        "timestamp": pa.array(timestamps, pa.int64()),
        "offset": pa.array(offsets, pa.int64()),
    }
    if with_headers:
        columns["headers"] = _bulk_headers(
            pa.array(headers, pa.binary()), np.array(trace_ids, dtype=np.uint64)
        )
    return columns


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
