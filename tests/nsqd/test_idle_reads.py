"""Idle connections' reads polled together (nsqd/idle_reads.py): bytes that are only NOPs
are taken by the poller without waking the read loop; anything else, the end of the stream and
a cancelled wait reach the read loop as a read of its own would."""

import socket
from contextlib import asynccontextmanager

import pytest
import trio

from nsqpy.nsqd.idle_reads import IdleReads
from tests.support.polling import wait_until

NOP = b"NOP\n"


class Reader:
    """A connection's side: takes whole NOPs, as ProtocolV2.absorb_nops does."""

    def __init__(self) -> None:
        self.absorbed = 0

    def absorb_nops(self, data: bytes) -> bool:
        count, rest = divmod(len(data), len(NOP))
        if rest or data != NOP * count:
            return False
        self.absorbed += count
        return True


def plain_pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return ours, theirs


@asynccontextmanager
async def running_poller():
    async with trio.open_nursery() as nursery:
        idle = IdleReads()
        nursery.start_soon(idle.run)
        yield idle, nursery
        nursery.cancel_scope.cancel()


async def test_nops_are_absorbed_and_only_a_command_wakes_the_reader():
    ours, theirs = plain_pair()
    reader = Reader()
    received: list[bytes] = []
    async with running_poller() as (idle, nursery):

        async def read_loop() -> None:
            received.append(await idle.receive(ours.fileno(), reader))

        nursery.start_soon(read_loop)
        theirs.sendall(NOP)
        await wait_until(lambda: reader.absorbed == 1)
        theirs.sendall(NOP * 3)
        await wait_until(lambda: reader.absorbed == 4)
        assert received == []
        theirs.sendall(b"NOP\nRDY 1\n")
        await wait_until(lambda: received)
        assert received == [b"NOP\nRDY 1\n"] and reader.absorbed == 4
    ours.close()
    theirs.close()


async def test_the_end_of_the_stream_reaches_the_reader():
    ours, theirs = plain_pair()
    async with running_poller() as (idle, _nursery):
        theirs.close()
        with trio.fail_after(5):
            assert await idle.receive(ours.fileno(), Reader()) == b""
    ours.close()


async def test_a_cancelled_wait_leaves_the_descriptor_free_for_the_next_one():
    ours, theirs = plain_pair()
    async with running_poller() as (idle, _nursery):
        with trio.move_on_after(0.05):
            await idle.receive(ours.fileno(), Reader())
        theirs.sendall(b"CLS\n")
        with trio.fail_after(5):
            assert await idle.receive(ours.fileno(), Reader()) == b"CLS\n"
    ours.close()
    theirs.close()


async def test_many_connections_are_served_by_one_poller():
    pairs = [plain_pair() for _ in range(200)]
    readers = [Reader() for _ in pairs]
    received: dict[int, bytes] = {}
    async with running_poller() as (idle, nursery):

        async def read_loop(index: int) -> None:
            received[index] = await idle.receive(pairs[index][0].fileno(), readers[index])

        for index in range(len(pairs)):
            nursery.start_soon(read_loop, index)
        for _ours, theirs in pairs:
            theirs.sendall(NOP)
        await wait_until(lambda: all(reader.absorbed == 1 for reader in readers))
        for index, (_ours, theirs) in enumerate(pairs):
            theirs.sendall(b"FIN %d\n" % index)
        await wait_until(lambda: len(received) == len(pairs))
        assert received == {index: b"FIN %d\n" % index for index in range(len(pairs))}
    for ours, theirs in pairs:
        ours.close()
        theirs.close()


async def test_a_wait_after_the_poller_ended_fails_as_a_read_would():
    """nsqd stopping: a read loop that waits after the poller ended sees an OSError, which
    ends its connection as a failed read does, instead of an error nothing expects."""
    ours, theirs = plain_pair()
    async with running_poller() as (idle, nursery):
        nursery.cancel_scope.cancel()
    with pytest.raises(OSError):
        await idle.receive(ours.fileno(), Reader())
    ours.close()
    theirs.close()
