"""The cluster simulator's V2 clients (`nsqpy/fault_schedule.py`): an idempotent producer
(`PUB_SEQ`, docs/protocol.md §3.10) and a consumer of a partition's channel, each speaking
the wire protocol over the simulated network to the partition's leader as the master names
it, with the common codec. They keep what the checks need: what was acknowledged, what was
delivered, when each message was finished and on which node.
"""

import random
from dataclasses import dataclass, field

import trio

from nsqpy.common.command import (
    MAGIC_V2,
    encode_command,
    encode_fin,
    encode_identify,
    encode_pub_seq,
    encode_rdy,
    encode_req,
)
from nsqpy.common.frame import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Frame,
    FrameDecoder,
)
from nsqpy.common.message import decode_message
from nsqpy.simulated_network import HostNetwork

# What a client waits for an answer before it gives the connection up.
ANSWER_TIMEOUT = 5.0
_HEARTBEAT = b"_heartbeat_"


class LinkClosed(Exception):
    """The connection ended, or answered nothing in time."""


class V2Link:
    """One V2 connection: the magic and IDENTIFY sent, then commands and frames (heartbeats
    answered with NOP)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._decoder = FrameDecoder()
        self._frames: list[Frame] = []

    @classmethod
    async def open(cls, network: HostNetwork, host: str, port: int, client_id: str) -> "V2Link":
        try:
            with trio.fail_after(ANSWER_TIMEOUT):
                stream = await network.connect(host, port)
                link = cls(stream)
                identify = {"client_id": client_id, "feature_negotiation": True}
                await link.send(MAGIC_V2 + encode_identify(identify))
                answer = await link.frame()
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as error:
            raise LinkClosed(str(error) or type(error).__name__) from None
        if answer.frame_type != FRAME_TYPE_RESPONSE:
            await link.close()
            raise LinkClosed(f"IDENTIFY refused: {answer.data[:100]!r}")
        return link

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            raise LinkClosed(str(error)) from None

    async def frame(self) -> Frame:
        """The next frame that is not a heartbeat."""
        while True:
            while not self._frames:
                try:
                    data = await self.stream.receive_some()
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    raise LinkClosed(str(error)) from None
                if not data:
                    raise LinkClosed("the node closed the connection")
                self._frames.extend(self._decoder.receive_data(data))
            frame = self._frames.pop(0)
            if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == _HEARTBEAT:
                await self.send(encode_command(b"NOP"))
                continue
            return frame

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


@dataclass
class IdempotentProducer:
    """Publishes `<name>-<sequence>` with PUB_SEQ, each retried with its sequence until it is
    acknowledged (no answer, a refusal, a lost connection: the same publish again)."""

    name: str
    partition: int
    acknowledged: list[bytes] = field(default_factory=list)
    next_sequence: int = 0
    # The node that acknowledged each publish taken at its first attempt (it wrote it; a
    # retry's OK may come from a leader that found it stored by another).
    written_by: dict[bytes, str] = field(default_factory=dict)


@dataclass
class Consumer:
    """A consumer of channel `channel` of one partition: RDY 8, FIN for most messages, REQ 0
    now and then (the message comes again: not finished), and now and then a pause of up to
    3 s (a backlog)."""

    partition: int
    channel: str = "c"
    # Every body delivered, in order, and each finished one: when, and to which node.
    delivered: list[bytes] = field(default_factory=list)
    finished: dict[bytes, tuple[float, str]] = field(default_factory=dict)
    # A finished message that came again: (body, when, the node it came from).
    again: list[tuple[bytes, float, str]] = field(default_factory=list)


async def publish_forever(
    network: HostNetwork,
    producer: IdempotentProducer,
    topic: str,
    leader_address,
    rng: random.Random,
) -> None:
    """`leader_address(partition)`: the (host, TCP port) of the partition's leader, or None."""
    link: V2Link | None = None
    address: tuple[str, int] | None = None
    retried = -1  # the sequence last sent
    try:
        while True:
            await trio.sleep(rng.uniform(0.05, 0.5))
            if link is None:
                address = leader_address(producer.partition)
                if address is None:
                    continue
                try:
                    link = await V2Link.open(network, address[0], address[1], producer.name)
                except LinkClosed:
                    continue
            sequence = producer.next_sequence
            body = f"{producer.name}-{sequence}".encode()
            first_attempt = sequence != retried
            retried = sequence
            command = encode_pub_seq(topic, producer.partition, producer.name, sequence, body)
            answer = None
            try:
                await link.send(command)
                with trio.move_on_after(ANSWER_TIMEOUT):
                    answer = await link.frame()
            except LinkClosed:
                pass
            if answer is not None and answer.frame_type == FRAME_TYPE_RESPONSE:
                producer.acknowledged.append(body)
                if first_attempt and address is not None:
                    producer.written_by[body] = address[0]
                producer.next_sequence += 1
                continue
            # No answer or a refusal: another connection, to whoever leads now, and the same
            # publish again (the partition stores it once, or says it holds it).
            await link.close()
            link = None
    finally:
        if link is not None:
            await link.close()


async def consume_forever(
    network: HostNetwork,
    consumer: Consumer,
    topic: str,
    leader_address,
    rng: random.Random,
) -> None:
    link: V2Link | None = None
    try:
        while True:
            address = leader_address(consumer.partition)
            if address is None:
                await trio.sleep(0.1)
                continue
            host = address[0]
            try:
                name = f"consumer-{consumer.partition}"
                link = await V2Link.open(network, host, address[1], name)
                await link.send(
                    encode_command(b"SUB", topic, consumer.channel, consumer.partition)
                    + encode_rdy(8)
                )
                subscribed = await link.frame()
                if subscribed.frame_type != FRAME_TYPE_RESPONSE:
                    raise LinkClosed(f"SUB refused: {subscribed.data[:100]!r}")
                while True:
                    frame = await link.frame()
                    if frame.frame_type == FRAME_TYPE_ERROR:
                        if frame.data.startswith((b"E_FIN_FAILED", b"E_REQ_FAILED")):
                            continue
                        raise LinkClosed(frame.data[:100].decode(errors="replace"))
                    if frame.frame_type != FRAME_TYPE_MESSAGE:
                        continue
                    message = decode_message(frame.data)
                    now = trio.current_time()
                    body = message.body
                    consumer.delivered.append(body)
                    if body in consumer.finished:
                        consumer.again.append((body, now, host))
                    if rng.random() < 0.05:
                        await link.send(encode_req(message.id, 0))
                        continue
                    await link.send(encode_fin(message.id))
                    # Finished once the FIN is on its way (a link that broke meanwhile, say
                    # while this consumer was busy, took none).
                    consumer.finished.setdefault(body, (trio.current_time(), host))
                    if rng.random() < 0.03:
                        # A consumer busy elsewhere for a while: a backlog builds up, as it
                        # does when a failover comes.
                        await trio.sleep(rng.uniform(0.5, 3.0))
            except LinkClosed:
                pass
            if link is not None:
                await link.close()
                link = None
            await trio.sleep(0.1)
    finally:
        if link is not None:
            await link.close()
