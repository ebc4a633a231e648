"""An in-process nsqd and a subprocess nsqd each take a message from PUB to SUB to FIN."""

import trio

from nsqpy.common.command import (
    MAGIC_V2,
    encode_fin,
    encode_identify,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message
from tests.harness import V2Connection, start_nsqd
from tests.support.nsqd import tcp_port


async def test_in_process_publish_and_consume(nsqd):
    stream = await trio.open_tcp_stream("127.0.0.1", tcp_port(nsqd))
    decoder = FrameDecoder()
    await stream.send_all(MAGIC_V2 + encode_sub("t", "c") + encode_rdy(1) + encode_pub("t", b"hi"))
    frames = []
    while not any(f.frame_type == FRAME_TYPE_MESSAGE for f in frames):
        frames += decoder.receive_data(await stream.receive_some(65536))
    message = decode_message([f for f in frames if f.frame_type == FRAME_TYPE_MESSAGE][0].data)
    assert message.body == b"hi" and message.attempts == 1
    await stream.send_all(encode_fin(message.id))
    channel = nsqd.topics["t"].channels["c"]
    while channel.in_flight:
        await trio.sleep(0.001)
    await stream.aclose()


def test_subprocess_nsqd_logs_port_and_serves(tmp_path):
    daemon = start_nsqd(tmp_path)
    try:
        connection = V2Connection(daemon.port())
        connection.send(encode_identify({"client_id": "smoke"}))
        assert connection.read_response().data == b"OK"
        connection.send(encode_sub("t", "c") + encode_rdy(5))
        assert connection.read_response().data == b"OK"
        connection.send(encode_pub("t", b"body"))
        assert connection.read_messages(1)[0].body == b"body"
    finally:
        assert daemon.stop() == 0
