"""A TCP connection's hops between `--workers` (docs/design.md §15), the I/O of two effects
the V2 interpreter yields (`nsqd/effects.py`) when the placement (`nsqd/placement.py`) names
another worker for a topic command: the connection moves there (`MoveTo`: its first topic
command, or any SUB before it subscribed), or the publish is forwarded to the owner and its
answer takes its place among the batch's replies (`Forward`, `AnswerForwarded`); a connection
handed over here stands where its sender stood (`restore`).

Moving hands the descriptor itself over when the socket is plain, else keeps the connection
here and relays its plain bytes over a socket pair whose other end is handed over (TLS and
compression state are this process's).
"""

import dataclasses
import json
import weakref
from typing import TYPE_CHECKING, Any

import trio

from nsqpy.common.command import MAGIC_V2, encode_command
from nsqpy.common.errors import ProtocolError
from nsqpy.daemon.auth import AuthState
from nsqpy.nsqd.client import Client
from nsqpy.nsqd.handoff import Handoff
from nsqpy.nsqd.idle_reads import RECEIVE_SIZE

if TYPE_CHECKING:
    from nsqpy.nsqd.connection import V2Connection
    from nsqpy.nsqd.protocol_v2 import ProtocolV2
    from nsqpy.nsqd.worker import Forwarded, Worker

# A forwarded publish's answer: (reply index, command, (frame type, data) or the error of an
# owner that is gone).
ForwardedAnswer = tuple[int, Any, "tuple[int, bytes] | ProtocolError"]
# Identify settings a relayed connection's owner must not act on: its sender did.
_SENDER_FEATURES = ("tls_v1", "snappy", "deflate", "deflate_level")


class WorkerHops:
    def __init__(self, connection: "V2Connection") -> None:
        # A weak reference: the connection holds this object, and a strong one back would make
        # the pair a cycle, which only the collector frees.
        self.connection = weakref.proxy(connection)
        # Where the connection moves once its batch is answered: (owner, handoff, relayed).
        self.moving: tuple[int, Handoff, bool] | None = None
        # The batch's publishes sent to other workers: (reply index, command, answer).
        self.forwarded: list[tuple[int, Any, Forwarded]] = []

    @property
    def worker(self) -> "Worker":
        worker = self.connection.nsqd.worker
        assert worker is not None  # only a worker's placement names another worker
        return worker

    def restore(self, client: Client, handoff: Handoff) -> None:
        """The client as the worker that handed it over negotiated and authorized it."""
        client.tls = handoff.tls
        client.tls_common_name = handoff.tls_common_name
        for key, value in handoff.tls_details.items():
            setattr(client, key, value)
        client.snappy = handoff.snappy
        client.deflate = handoff.deflate
        client.deflate_level = handoff.deflate_level
        client.auth_secret = handoff.auth_secret
        if handoff.auth_state is not None:
            client.auth_state = AuthState.from_dict(handoff.auth_state)

    def move_to(self, owner: int, command, protocol: "ProtocolV2", fd: int) -> None:
        """Hand the connection to `owner` once this batch is answered: the descriptor itself
        when the socket is plain (`fd` ≥ 0), else a relay over a socket pair (`move`)."""
        client = protocol.client
        identify = protocol.identify_body
        relayed = fd < 0
        if relayed and identify is not None:
            settings = json.loads(identify)
            for key in _SENDER_FEATURES:
                settings.pop(key, None)
            identify = json.dumps(settings).encode()
        preamble = [MAGIC_V2]
        if identify is not None:
            preamble.append(encode_command(b"IDENTIFY", body=identify))
        handoff = Handoff(
            remote_address=client.remote_address,
            preamble=b"".join(preamble),
            pending=encode_command(command.name, *command.args, body=command.body)
            + protocol.parser.take_buffered(),
            tls=client.tls,
            tls_common_name=client.tls_common_name,
            tls_details=client.tls_stats(),
            snappy=client.snappy,
            deflate=client.deflate,
            deflate_level=client.deflate_level,
            auth_secret=client.auth_secret,
            auth_state=dataclasses.asdict(client.auth_state) if client.auth_state else None,
        )
        self.moving = (owner, handoff, relayed)

    async def move(self, fd: int) -> trio.SocketStream | None:
        """Hand the connection over; the relay's end of the socket pair when it is relayed."""
        assert self.moving is not None
        owner, handoff, relayed = self.moving
        connection = self.connection
        connection.nsqd.log.info(
            "[%s] %s to worker %d, which owns its topic",
            connection.client,
            "relayed" if relayed else "moved",
            owner,
        )
        try:
            if relayed:
                return await self.worker.hand_off_pair(owner, handoff)
            await self.worker.hand_off(owner, fd, handoff)
        except OSError as error:
            # The owner is starting again (it died): the client connects again, as to an
            # nsqd that restarted.
            connection.nsqd.log.error(
                "[%s] worker %d did not take the connection - %s; closing it",
                connection.client,
                owner,
                error,
            )
        return None

    async def relay(self, stream: trio.abc.Stream, pair: trio.SocketStream) -> None:
        """Carry the plain bytes both ways between the client (through its TLS or
        compression) and the owner's end of the pair, until either side ends."""

        async def carry(source, destination, done: trio.CancelScope) -> None:
            try:
                while data := await source.receive_some(RECEIVE_SIZE):
                    await destination.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            done.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(carry, stream, pair, nursery.cancel_scope)
            nursery.start_soon(carry, pair, stream, nursery.cancel_scope)

    async def forward(self, owner: int, command, index: int) -> None:
        """Send a publish (or Youzan's INTERNAL_CREATE_TOPIC) to another worker's partition to
        be run there; its answer, the owner's, takes the batch's reply at `index`
        (`answer_forwarded`). The interpreter checked the client's authorizations."""
        try:
            pending = await self.worker.forward(
                owner, encode_command(command.name, *command.args, body=command.body)
            )
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            raise _worker_gone(command) from None
        self.forwarded.append((index, command, pending))

    async def forwarded_answers(self) -> list[ForwardedAnswer]:
        """The owners' answers to the batch's forwarded publishes: (reply index, command,
        (frame type, data)), or a ProtocolError for one whose owner is gone. The interpreter
        puts them in their places (`ProtocolV2._place_forwarded`)."""
        forwarded, self.forwarded = self.forwarded, []
        answers: list[ForwardedAnswer] = []
        for index, command, pending in forwarded:
            try:
                answers.append((index, command, await pending.answer()))
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
                answers.append((index, command, _worker_gone(command)))
        return answers


def _worker_gone(command) -> ProtocolError:
    return ProtocolError(
        "E_PUB_FAILED", f"{command.name.decode()} failed: the topic's worker is gone"
    )
