"""The log-topic source's position options, parsed as the Kafka source takes them (no Spark
needed)."""

import pytest

from nsqpy.spark.options import position_spec


def spec(prefix: str = "starting", default: str = "latest", **options: str):
    return position_spec({k.lower(): v for k, v in options.items()}, prefix, "orders", default)


def test_offsets_are_earliest_latest_or_json_per_partition():
    assert spec() == ("latest", None)
    assert spec(startingOffsets="EARLIEST") == ("earliest", None)
    assert spec(startingOffsets='{"0": 42, "1": -2}') == ("offsets", {0: 42, 1: -2})
    # Kafka's form, keyed by the topic first.
    assert spec(startingOffsets='{"orders": {"3": -1}}') == ("offsets", {3: -1})


def test_timestamps_are_milliseconds_for_every_partition_or_per_partition():
    assert spec(startingTimestamp="1764000000000") == ("timestamps", {None: 1764000000000})
    by_partition = spec("ending", endingOffsetsByTimestamp='{"1": 5}')
    assert by_partition == ("timestamps", {1: 5})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "first"}, 'is "earliest", "latest" or JSON'),
        ({"startingOffsets": "[1]"}, "must be a JSON object"),
        ({"startingOffsets": '{"zero": 1}'}, "not a partition number"),
        ({"startingOffsets": '{"0": -3}'}, "-2 (earliest) or -1 (latest)"),
        ({"startingOffsets": '{"0": "12"}'}, "a virtual offset"),
        ({"startingTimestamp": "yesterday"}, "milliseconds since the epoch"),
        ({"startingTimestamp": "1", "startingOffsets": "latest"}, "cannot be given together"),
    ],
)
def test_bad_positions_say_what_is_wrong(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec(**options)


def test_a_read_cannot_end_at_the_earliest():
    with pytest.raises(ValueError, match='"endingOffsets" cannot be "earliest"'):
        spec("ending", endingOffsets="earliest")
