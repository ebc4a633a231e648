"""nsqd processes the durability, signal and data path tests publish to and drain."""

from pathlib import Path

from nsqpy.common.command import encode_fin, encode_mpub, encode_rdy, encode_sub
from nsqpy.common.message import DecodedMessage
from tests.harness import DaemonProcess, V2Connection


def publish(port: int, topic: str, bodies: list[bytes], batch: int = 500) -> None:
    """MPUB `bodies` in batches, each acknowledged with OK before the next."""
    connection = V2Connection(port)
    try:
        for start in range(0, len(bodies), batch):
            connection.send(encode_mpub(topic, bodies[start : start + batch]))
            assert connection.read_response().data == b"OK"
    finally:
        connection.close()


def numbered(count: int) -> list[bytes]:
    return [b"message %05d" % n for n in range(count)]


def number_of_body(body: bytes) -> int:
    assert body.startswith(b"message "), body
    return int(body[8:])


def number_of(message: DecodedMessage) -> int:
    return number_of_body(message.body)


def nsqd_process(data_path: Path) -> DaemonProcess:
    """An nsqd on ephemeral ports, not yet started (for tests that expect it to fail)."""
    args = ["-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0", f"-data-path={data_path}"]
    return DaemonProcess("nsqd", args, cwd=data_path)


def consume_all(port: int, topic: str, channel: str, count: int) -> set[int]:
    connection = V2Connection(port)
    try:
        connection.send(encode_sub(topic, channel) + encode_rdy(count))
        assert connection.read_response().data == b"OK"
        messages = connection.read_messages(count)
        connection.send(b"".join(encode_fin(message.id) for message in messages))
        return {number_of(message) for message in messages}
    finally:
        connection.close()
