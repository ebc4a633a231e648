"""Youzan's `GET /message/get` on a log topic's partition (docs/protocol.md §6.2): one message
found by count, ID, virtual offset or (nsqpy's) time, with Youzan's JSON and error answers."""

import time

from nsqpy.common.command import encode_command
from tests.support.polling import wait_until
from tests.youzan.support import connect, create_partitions, http, pub_ext


async def get(nsqd, query: str):
    return await http(nsqd, "GET", f"/message/get?topic=yz&{query}")


async def test_a_message_is_found_by_count_id_offset_and_time(nsqd):
    await create_partitions(nsqd, "yz", 0, 1, ext="true")
    writer = await connect(nsqd)
    replies = [await writer.publish_traced("yz", 70 + n, b"m%d" % n, 1) for n in range(3)]
    await writer.command_ok(pub_ext("yz", {"k": "v"}, b"with header", 1))
    second = replies[1]
    by_count = (await get(nsqd, "partition=1&search_mode=count&search_pos=1")).json()
    assert by_count["id"] == second.internal_id
    assert (by_count["body"], by_count["trace_id"], by_count["offset"]) == (
        "m1",
        71,
        second.offset,
    )
    assert (by_count["queue_cnt_index"], by_count["attempts"], by_count["ext"]) == (1, 0, "")
    assert abs(by_count["timestamp"] / 1e9 - time.time()) < 60
    # By ID, the partition is the ID's when the request does not name one.
    by_id = (await get(nsqd, f"search_mode=id&search_pos={second.internal_id}")).json()
    assert by_id == by_count
    by_offset = await get(
        nsqd, f"partition=1&search_mode=virtual_offset&search_pos={second.offset}"
    )
    assert by_offset.json() == by_count
    by_time = await get(nsqd, "partition=1&search_mode=timestamp&search_pos=0")
    assert by_time.json()["body"] == "m0"
    with_ext = await get(nsqd, "partition=1&search_mode=count&search_pos=3&needext=true")
    assert (with_ext.json()["body"], with_ext.json()["ext"]) == ("with header", '{"k": "v"}')


async def test_what_cannot_be_found_or_parsed_is_answered_as_youzans(nsqd):
    await create_partitions(nsqd, "yz", 0)
    writer = await connect(nsqd)
    reply = await writer.publish_traced("yz", 1, b"only", 0)
    bad_pos = await get(nsqd, "partition=0&search_mode=count&search_pos=x")
    assert (bad_pos.status, bad_pos.json()) == (
        400,
        {"message": 'strconv.ParseInt: parsing "x": invalid syntax'},
    )
    bad_mode = await get(nsqd, "partition=0&search_mode=name&search_pos=1")
    assert bad_mode.status == 400
    assert bad_mode.json()["message"].startswith("search mode should be one of id/count")
    for query in (
        "partition=0&search_mode=count&search_pos=1",
        f"partition=0&search_mode=id&search_pos={reply.internal_id + 1}",
        "partition=0&search_mode=virtual_offset&search_pos=1000000",
    ):
        missing = await get(nsqd, query)
        assert missing.status == 404, (query, missing)


async def test_a_channels_delayed_message_is_found_in_the_delay_queue_by_id(nsqd):
    """`delayed_queue=true`: a DPUB waiting in the partition's delay queue, for a channel."""
    await create_partitions(nsqd, "yz", 0)
    created = await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    assert created.status == 200, created
    writer = await connect(nsqd)
    await writer.command_ok(encode_command("DPUB", "yz", 60_000, 0, body=b"later"))
    message_id = (await get(nsqd, "partition=0&search_mode=count&search_pos=0")).json()["id"]

    async def found() -> bool:
        query = f"partition=0&delayed_queue=true&search_mode=id&search_pos={message_id}"
        return (await get(nsqd, f"{query}&channel=c")).status == 200

    await wait_until(found, "the DPUB in the delay queue")
    query = f"partition=0&delayed_queue=true&search_mode=id&search_pos={message_id}"
    delayed = (await get(nsqd, f"{query}&channel=c")).json()
    assert (delayed["id"], delayed["orig_id"], delayed["body"]) == (message_id, message_id, "later")
    for extra, status, text in [
        ("&channel=other", 404, "no message found in delayed queue"),
        ("", 400, "delayed queue search channel must be given"),
    ]:
        reply = await get(nsqd, f"{query}{extra}")
        assert (reply.status, reply.json()) == (status, {"message": text})
    by_count = await get(nsqd, "partition=0&delayed_queue=true&search_mode=count&search_pos=0")
    assert (by_count.status, by_count.json()) == (
        400,
        {"message": "delayed queue search mode must be id"},
    )
