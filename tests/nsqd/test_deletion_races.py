"""Routes and timers that await per partition against a `/topic/delete` meanwhile, on an
in-process nsqd whose log topic `lt` has channel `c`: fixdata (reading the files), greedyclean
and retention (waiting for a producer snapshot), and the channel routes a cluster leader
answers once its followers are told (setoffset, the controls, create and delete). The
partition is gone, as it would have been a moment earlier: Go's 404 TOPIC_NOT_FOUND, never a
500 from its closed files, and the daemon serves on."""

import dataclasses

import pytest
import trio
import trio.testing

from nsqpy.daemon.http_server import HTTPError, Request
from nsqpy.nsqd.http_api import HTTPAPI
from nsqpy.nsqd.replication import SingleNode
from nsqpy.nsqd.server import NSQD
from tests.support.polling import wait_until


async def serving_log_topic(nsqd_options, nursery):
    """An in-process nsqd whose log topic `lt` has channel `c` and one message written."""
    server = NSQD(dataclasses.replace(nsqd_options, log_topic=["lt"]))
    await nursery.start(server.serve)
    topic = server.get_topic("lt")
    topic.get_channel("c")
    topic.publish([b"kept"])
    await server.storage.commit()
    return server, topic


def answer_into(outcome: list, handler, request: Request):
    """A task that puts the handler's answer to `request`, or its HTTPError, in `outcome`."""

    async def answer() -> None:
        try:
            outcome.append(await handler(request))
        except HTTPError as error:
            outcome.append(error)

    return answer


async def test_fixdata_on_a_topic_deleted_while_its_files_are_read_is_topic_not_found(
    nsqd_options, nursery
):
    """The check reads the log's files in a thread; a `/topic/delete` that removes them first
    makes fixdata Go's 404 TOPIC_NOT_FOUND, not a 500 (the HTTP fuzz found the race)."""
    server, _topic = await serving_log_topic(nsqd_options, nursery)
    request = Request("POST", b"/topic/fixdata?topic=lt", {}, b"")
    outcome: list = []
    threads = trio.to_thread.current_default_thread_limiter()
    # The check waits for a thread while the topic is deleted, then reads no files.
    async with threads:
        saved, threads.total_tokens = threads.total_tokens, 1
        try:
            nursery.start_soon(answer_into(outcome, HTTPAPI(server).topic_fix_data, request))
            await trio.testing.wait_all_tasks_blocked()
            server.delete_topic("lt")
        finally:
            threads.total_tokens = saved
    await wait_until(lambda: outcome)
    [error] = outcome
    assert isinstance(error, HTTPError)
    assert (error.status, error.message) == (404, "TOPIC_NOT_FOUND")


async def test_greedyclean_of_a_topic_deleted_while_it_waits_is_topic_not_found(
    nsqd_options, nursery
):
    """`/topic/greedyclean` waits for a producer snapshot being written (the periodic sync's)
    before it removes anything; a `/topic/delete` meanwhile makes it Go's 404
    TOPIC_NOT_FOUND, not a 500 for a log it can no longer clean."""
    server, topic = await serving_log_topic(nsqd_options, nursery)
    request = Request("POST", b"/topic/greedyclean?topic=lt", {}, b"")
    outcome: list = []
    async with topic.queue._snapshot_writing:
        nursery.start_soon(answer_into(outcome, HTTPAPI(server).topic_greedyclean, request))
        await trio.testing.wait_all_tasks_blocked()
        server.delete_topic("lt")
    await wait_until(lambda: outcome)
    [error] = outcome
    assert isinstance(error, HTTPError)
    assert (error.status, error.message) == (404, "TOPIC_NOT_FOUND")


async def test_retention_goes_on_past_a_topic_deleted_while_it_is_cleaned(nsqd_options, nursery):
    """The retention timer's run (`NSQD.clean_logs`) over a log topic that `/topic/delete`
    removes while its clean waits: the run ends as usual, and the daemon serves on (a closed
    index's error escaping it would end nsqd)."""
    server, topic = await serving_log_topic(nsqd_options, nursery)
    removed: list[int] = []

    async def retention_run() -> None:
        removed.append(await server.clean_logs())

    async with topic.queue._snapshot_writing:
        nursery.start_soon(retention_run)
        await trio.testing.wait_all_tasks_blocked()
        server.delete_topic("lt")
    await wait_until(lambda: removed)
    assert removed == [0]
    assert server.get_topic("lt") is not topic


class FollowersBeingTold(SingleNode):
    """A cluster leader's replication whose followers take their time: a change of the
    partition's channels is answered once the test lets `told` go."""

    def __init__(self) -> None:
        self.told = trio.Event()

    async def channels_changed(self) -> None:
        await self.told.wait()


@pytest.mark.parametrize(
    ("route", "handler", "body"),
    [
        ("/channel/setoffset", "channel_setoffset", b"timestamp:0"),
        ("/channel/skip", "channel_skip", b""),
        ("/channel/delete", "channel_delete", b""),
        ("/channel/create", "channel_create", b""),
    ],
)
async def test_a_channel_route_over_partitions_deleted_while_followers_are_told(
    nsqd_options, nursery, route, handler, body
):
    """Each partition's followers are told before the next partition is changed; a
    `/topic/delete` meanwhile leaves the rest to skip, and the answer is 404 TOPIC_NOT_FOUND
    (setoffset's seek in a deleted log answered 500 `No such file or directory`)."""
    server = NSQD(dataclasses.replace(nsqd_options, log_topic=["lt"]))
    await nursery.start(server.serve)
    followers = FollowersBeingTold()
    for number in (0, 1):
        topic = server.create_partition(
            "lt", number, partitioned=True, replication=lambda _topic: followers
        )
        topic.get_channel("c")
        topic.publish([b"kept"])
    await server.storage.commit()
    channel = "new" if route == "/channel/create" else "c"
    request = Request("POST", f"{route}?topic=lt&channel={channel}".encode(), {}, body)
    outcome: list = []
    nursery.start_soon(answer_into(outcome, getattr(HTTPAPI(server), handler), request))
    await trio.testing.wait_all_tasks_blocked()
    server.delete_topic("lt")
    followers.told.set()
    await wait_until(lambda: outcome)
    [error] = outcome
    assert isinstance(error, HTTPError)
    assert (error.status, error.message) == (404, "TOPIC_NOT_FOUND")
    assert server.registry.partitions("lt") == []
