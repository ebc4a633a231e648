"""Message IDs in Go nsqd's GUID layout (docs/protocol.md §1.6), without sleeping: fake clocks
only."""

import hashlib
import random
import re
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqpy.common.guid import MAX_NODE_ID, TWEPOCH, GUIDFactory, default_node_id, guid_fields

HEX_ID = re.compile(rb"[0-9a-f]{16}")
# 2023-11-14 22:13:20 UTC in ns; any instant after Go's twepoch will do.
NOW_NS = 1_700_000_000_000_000_000
PSEUDO_MS = 1 << 20  # one tick of the GUID timestamp, in ns


def assert_valid_and_increasing(ids: list[bytes]) -> None:
    assert all(HEX_ID.fullmatch(message_id) for message_id in ids)
    # Fixed-width lowercase hex: byte order is numeric order.
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False))
    assert len(set(ids)) == len(ids)


def test_twepoch_is_gos() -> None:
    assert TWEPOCH == 1288834974288
    assert MAX_NODE_ID == 1023


def test_exact_layout() -> None:
    factory = GUIDFactory(517, clock=lambda: NOW_NS)
    first, second = factory.next_id(), factory.next_id()
    expected = ((NOW_NS >> 20) - 1288834974288) << 22 | 517 << 12
    assert first == b"%016x" % expected
    assert second == b"%016x" % (expected + 1)


def test_real_clock_100k_ids() -> None:
    factory = GUIDFactory(1)
    ids = [factory.next_id() for _ in range(100_000)]
    assert_valid_and_increasing(ids)


def test_frozen_clock_borrows_the_next_timestamp() -> None:
    factory = GUIDFactory(3, clock=lambda: NOW_NS)
    ids = [factory.next_id() for _ in range(100_000)]
    assert_valid_and_increasing(ids)
    fields = [guid_fields(message_id) for message_id in ids]
    start = NOW_NS >> 20
    # 4096 IDs per pseudo-millisecond, then the sequence overflows into the next one.
    for index in (0, 1, 4095, 4096, 4097, 8191, 8192, 99_999):
        assert fields[index] == (start + index // 4096, 3, index % 4096)


def test_frozen_clock_catches_up_when_time_moves_on() -> None:
    now = [NOW_NS]
    factory = GUIDFactory(3, clock=lambda: now[0])
    ids = factory.next_ids(3 * 4096 + 5)  # borrowed 3 pseudo-ms ahead
    assert guid_fields(ids[-1])[0] == (NOW_NS >> 20) + 3
    now[0] += PSEUDO_MS  # the clock is still behind the borrowed timestamp
    ids.append(factory.next_id())
    assert guid_fields(ids[-1]) == ((NOW_NS >> 20) + 3, 3, 5)
    now[0] += 10 * PSEUDO_MS  # now past it: back to the clock, sequence 0
    ids.append(factory.next_id())
    assert guid_fields(ids[-1]) == ((NOW_NS >> 20) + 11, 3, 0)
    assert_valid_and_increasing(ids)


def test_clock_going_backwards() -> None:
    ticks = iter(range(NOW_NS, NOW_NS - 100_000 * PSEUDO_MS, -PSEUDO_MS))
    factory = GUIDFactory(9, clock=lambda: next(ticks))
    ids = [factory.next_id() for _ in range(100_000)]
    assert_valid_and_increasing(ids)
    # The timestamp never goes back: every ID stays at the first reading.
    assert {guid_fields(message_id)[0] for message_id in ids} == {
        (NOW_NS >> 20) + n for n in range(25)
    }


def test_jittery_clock_and_mixed_batches() -> None:
    rng = random.Random(1234)
    now = [NOW_NS]

    def clock() -> int:
        now[0] += rng.randint(-3 * PSEUDO_MS, 3 * PSEUDO_MS)
        return now[0]

    factory = GUIDFactory(1023, clock=clock)
    ids: list[bytes] = []
    while len(ids) < 100_000:
        count = rng.choice([0, 1, 1, 2, 7, 100, 4095, 4096, 4097, 9000])
        batch = factory.next_ids(count)
        assert len(batch) == count
        ids += batch
        ids.append(factory.next_id())
    assert_valid_and_increasing(ids)
    assert {guid_fields(message_id)[1] for message_id in ids} == {1023}


def test_batch_is_contiguous() -> None:
    factory = GUIDFactory(0, clock=lambda: NOW_NS)
    factory.next_ids(4000)
    batch = factory.next_ids(200)  # crosses the 4096 boundary
    fields = [guid_fields(message_id) for message_id in batch]
    assert fields[0] == (NOW_NS >> 20, 0, 4000)
    assert fields[95] == (NOW_NS >> 20, 0, 4095)
    assert fields[96] == ((NOW_NS >> 20) + 1, 0, 0)
    assert fields[-1] == ((NOW_NS >> 20) + 1, 0, 103)
    assert factory.next_ids(0) == []
    assert guid_fields(factory.next_id()) == ((NOW_NS >> 20) + 1, 0, 104)


@pytest.mark.parametrize("node_id", [0, 1, 2, 341, 512, 1023])
def test_node_id_is_in_bits_12_to_21(node_id: int) -> None:
    factory = GUIDFactory(node_id, clock=lambda: NOW_NS)
    for message_id in factory.next_ids(5000):
        value = int(message_id, 16)
        assert (value >> 12) & 0x3FF == node_id
        assert value & (0x3FF << 12) == node_id << 12
        assert guid_fields(message_id)[1] == node_id


def test_guid_fields_decodes() -> None:
    message_id = b"%016x" % ((123456 << 22) | (77 << 12) | 4095)
    assert guid_fields(message_id) == (TWEPOCH + 123456, 77, 4095)


@pytest.mark.parametrize("node_id", [-1, 1024, 10_000])
def test_node_id_out_of_range(node_id: int) -> None:
    with pytest.raises(ValueError, match=rf"^node id {node_id} must be in \[0,1024\)$"):
        GUIDFactory(node_id)


def _go_default_node_id(hostname: str) -> int:
    # nsqd/options.go: h := md5.New(); io.WriteString(h, hostname);
    # defaultID := int64(crc32.ChecksumIEEE(h.Sum(nil)) % 1024)
    digest = hashlib.md5(hostname.encode("utf-8")).digest()
    return (zlib.crc32(digest) & 0xFFFFFFFF) % 1024


@pytest.mark.parametrize(
    "hostname", ["localhost", "nsqd-0", "host.example.com", "", "ünïcode", "a" * 255]
)
def test_default_node_id_matches_go(hostname: str) -> None:
    node_id = default_node_id(hostname)
    assert node_id == _go_default_node_id(hostname)
    assert 0 <= node_id <= MAX_NODE_ID
    GUIDFactory(node_id)


def test_default_node_id_pinned_value() -> None:
    # md5("localhost") = 421aa90e079fa326b6494f812ad13e79, whose CRC-32 (IEEE) is 0x6906b410,
    # and 0x6906b410 % 1024 == 0x010.
    assert hashlib.md5(b"localhost").hexdigest() == "421aa90e079fa326b6494f812ad13e79"
    assert zlib.crc32(bytes.fromhex("421aa90e079fa326b6494f812ad13e79")) == 0x6906B410
    assert default_node_id("localhost") == 16


def test_clock_before_twepoch_still_gives_16_hex_digits() -> None:
    # Go's guid is an int64 whose 8 bytes are hex-encoded: two's complement, 16 digits.
    factory = GUIDFactory(5, clock=lambda: 0)
    ids = factory.next_ids(5000)
    assert_valid_and_increasing(ids)
    assert ids[0] == b"%016x" % ((((0 - TWEPOCH) << 22) | 5 << 12) & (2**64 - 1))
    assert guid_fields(ids[0]) == (0, 5, 0)
    assert guid_fields(ids[-1]) == (1, 5, 903)


@given(
    steps=st.lists(
        st.tuples(st.integers(-2, 3), st.sampled_from([0, 1, 1, 1, 7, 4095, 4096, 5000])),
        min_size=1,
        max_size=60,
    )
)
def test_single_and_batch_ids_are_the_layout_of_a_clock_that_never_goes_back(steps) -> None:
    """However single IDs (`next_id`, which keeps the pseudo-millisecond's hex prefix) and
    batches interleave, with a clock that stands, steps on or goes back, every ID is the
    layout of (the latest timestamp so far, borrowed ahead when a sequence runs out, node,
    sequence): what Go's factory gives, without its waits."""
    now = [NOW_NS]
    factory = GUIDFactory(77, clock=lambda: now[0])
    timestamp, sequence = -1, -1
    for tick, count in steps:
        now[0] += tick * PSEUDO_MS
        if count == 1:
            got = [factory.next_id()]
        else:
            got = factory.next_ids(count)
        expected = []
        for _ in range(count):
            clock = now[0] >> 20
            if clock > timestamp:
                timestamp, sequence = clock, 0
            elif sequence == 4095:
                timestamp, sequence = timestamp + 1, 0
            else:
                sequence += 1
            expected.append(b"%016x" % (((timestamp - TWEPOCH) << 22) | 77 << 12 | sequence))
        assert got == expected
