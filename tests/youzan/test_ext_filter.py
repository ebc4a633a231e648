"""Youzan's IDENTIFY `ext_filter` (nsqd/ext_filter.py, docs/protocol.md §3.5): a consumer of
an ext topic receives only the messages whose JSON header matches; the others are finished
for the channel without being sent; a filter Youzan cannot use is ignored. (The rules on their
own: tests/nsqd/test_ext_filter_rules.py.)"""

from nsqpy.common.command import encode_fin, encode_pub
from tests.support.polling import wait_until
from tests.youzan.support import connect, create_partitions, http, pub_ext


async def test_a_filtered_consumer_receives_only_what_matches_and_the_rest_is_finished(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    reader = await connect(nsqd)
    await reader.identify(
        extend_support=True,
        ext_filter={"type": 3, "filter_ext_key": "region", "filter_data": "eu-*"},
    )
    await reader.subscribe_as("SUB", "yz", "c", 0, rdy=10)
    writer = await connect(nsqd)
    for region, body in (("eu-west", b"1"), ("us", b"2"), (None, b"3"), ("eu-north", b"4")):
        header = {"region": region} if region else {}
        await writer.command_ok(pub_ext("yz", header, body, 0))
    messages = await reader.read_youzans(2)
    assert [m.body[-1:] for m in messages] == [b"1", b"4"]
    await reader.send(b"".join(encode_fin(m.id) for m in messages))

    async def all_confirmed() -> bool:
        stats = (await http(nsqd, "GET", "/stats?format=json&topic=yz&channel=c")).json()
        channel = stats["topics"][0]["channels"][0]
        return channel["depth"] == 0 and channel["in_flight_count"] == 0

    await wait_until(all_confirmed, "the filtered-out messages finished for the channel")


async def test_a_filter_youzan_cannot_use_is_ignored_as_youzans_is(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    reader = await connect(nsqd)
    await reader.identify(
        extend_support=True, ext_filter={"type": 2, "filter_ext_key": "k", "filter_data": "("}
    )
    await reader.subscribe_as("SUB", "yz", "c", 0, rdy=10)
    writer = await connect(nsqd)
    await writer.command_ok(pub_ext("yz", {"k": "v"}, b"x", 0))
    await writer.command_ok(encode_pub("yz", b"y", 0))
    assert len(await reader.read_youzans(2)) == 2
