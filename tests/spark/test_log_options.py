"""The log-topic source's topic and position options, parsed as the Kafka source takes them
(no Spark needed)."""

import pytest

from nsqpy.spark.options import position_spec, topic_selection

ORDERS = topic_selection({"topic": "orders"})
SEVERAL = topic_selection({"subscribe": "orders,refunds"})


def spec(prefix: str = "starting", default: str = "latest", selection=ORDERS, **options: str):
    return position_spec({k.lower(): v for k, v in options.items()}, prefix, selection, default)


def test_offsets_are_earliest_latest_or_json_per_partition():
    assert spec() == ("latest", None)
    assert spec(startingOffsets="EARLIEST") == ("earliest", None)
    expected = {("orders", 0): 42, ("orders", 1): -2}
    assert spec(startingOffsets='{"0": 42, "1": -2}') == ("offsets", expected)
    # Kafka's form, keyed by the topic first.
    assert spec(startingOffsets='{"orders": {"3": -1}}') == ("offsets", {("orders", 3): -1})


def test_several_topics_take_kafkas_positions_by_topic():
    given = '{"orders": {"0": 7}, "refunds": {"1": -2}}'
    expected = {("orders", 0): 7, ("refunds", 1): -2}
    assert spec(startingOffsets=given, selection=SEVERAL) == ("offsets", expected)
    by_time = spec("ending", selection=SEVERAL, endingOffsetsByTimestamp='{"refunds": {"0": 5}}')
    assert by_time == ("timestamps", {("refunds", 0): 5})
    with pytest.raises(ValueError, match="gives positions by topic"):
        spec(startingOffsets='{"0": 42}', selection=SEVERAL)
    with pytest.raises(ValueError, match="names topic 'other', which the source does not read"):
        spec(startingOffsets='{"other": {"0": 1}}', selection=SEVERAL)


def test_timestamps_are_milliseconds_for_every_partition_or_per_partition():
    assert spec(startingTimestamp="1764000000000") == ("timestamps", {None: 1764000000000})
    by_partition = spec("ending", endingOffsetsByTimestamp='{"1": 5}')
    assert by_partition == ("timestamps", {("orders", 1): 5})


def test_the_topics_come_from_exactly_one_of_kafkas_options_or_topic():
    assert topic_selection({"subscribe": "a, b,a"}).topics == ("a", "b")
    assert topic_selection({"subscribe": "a"}).single == "a"
    pattern = topic_selection({"subscribepattern": "orders-.*"})
    assert pattern.pattern is not None and pattern.single is None
    assigned = topic_selection({"assign": '{"a": [0, 2], "b": [1]}'})
    assert assigned.topics == ("a", "b") and assigned.takes("a", 2)
    assert not assigned.takes("a", 1) and not assigned.takes("c", 0)
    assert not ORDERS.by_topic and SEVERAL.by_topic


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, 'exactly one of the options "topic", "subscribe", "subscribePattern", "assign"'),
        ({"topic": "a", "subscribe": "b"}, 'not "topic" and "subscribe"'),
        ({"topic": "a,b"}, 'use "subscribe" for several'),
        ({"subscribe": "a,b c"}, "not a valid topic name"),
        ({"subscribe": " , "}, "names no topic"),
        ({"subscribepattern": "orders-("}, "not a regular expression"),
        ({"assign": "[0]"}, "JSON of partitions per topic"),
        ({"assign": '{"a": [-1]}'}, "not a list of partition numbers"),
    ],
)
def test_bad_topic_options_say_what_is_wrong(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        topic_selection(options)


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
