"""nsqpy.nsqd.embed and nsqpy.nsqlookupd.embed: trio `serve()` and thread-backed
`run_in_thread()`."""

import os
import time

import pytest

from nsqpy.client.blocking import Consumer, Producer, http_json, http_request
from nsqpy.nsqd import embed as nsqd_embed
from nsqpy.nsqlookupd import embed as lookupd_embed


async def test_serve_in_trio_yields_a_listening_nsqd(tmp_path):
    async with nsqd_embed.serve(data_path=str(tmp_path), mem_queue_size=5) as server:
        assert server.tcp_address.startswith("127.0.0.1:")
        assert not server.tcp_address.endswith(":0")
        assert server.options.mem_queue_size == 5
    # Clean shutdown persisted the metadata.
    assert (tmp_path / "nsqd.dat").exists()


async def test_serve_lookupd_in_trio():
    async with lookupd_embed.serve() as server:
        assert server.http_address.startswith("127.0.0.1:")
        assert server.options.broadcast_address == "127.0.0.1"


def test_run_in_thread_publish_consume_and_temporary_data_path():
    handle = nsqd_embed.run_in_thread()
    data_path = handle.data_path
    try:
        assert os.path.isdir(data_path)
        with Producer(handle.tcp_address) as producer:
            producer.publish("embedded", b"hello")
        with Consumer(handle.tcp_address, "embedded", "c") as consumer:
            message = consumer.receive(timeout=5)
            assert message.body == b"hello"
            message.finish()
            # A zero timeout looks without waiting: nothing more is there.
            assert consumer.receive(timeout=0) is None
        assert http_request(handle.http_address, "/ping") == b"OK"
    finally:
        handle.stop()
    handle.stop()  # idempotent
    assert not os.path.exists(data_path)


def test_run_in_thread_keeps_messages_across_restart(tmp_path):
    with nsqd_embed.run_in_thread(data_path=str(tmp_path)) as handle:
        with Producer(handle.tcp_address) as producer:
            producer.publish("kept", b"persisted")
    with nsqd_embed.run_in_thread(data_path=str(tmp_path)) as handle:
        with Consumer(handle.tcp_address, "kept", "c") as consumer:
            assert consumer.receive(timeout=5).body == b"persisted"


def test_run_in_thread_start_error_is_raised(tmp_path):
    with nsqd_embed.run_in_thread(data_path=str(tmp_path)) as first:
        with pytest.raises(OSError):
            nsqd_embed.run_in_thread(data_path=str(tmp_path), tcp_address=first.tcp_address)


def test_lookupd_in_thread_registers_an_embedded_nsqd(tmp_path):
    with lookupd_embed.run_in_thread() as lookupd:
        with nsqd_embed.run_in_thread(
            data_path=str(tmp_path), lookupd_tcp_address=[lookupd.tcp_address]
        ) as nsqd:
            http_request(nsqd.http_address, "/topic/create", method="POST", topic="t")
            port = int(nsqd.tcp_address.rsplit(":", 1)[1])
            _poll(
                lambda: any(
                    p["tcp_port"] == port
                    for p in (http_json(lookupd.http_address, "/nodes").get("producers") or [])
                )
            )


def _poll(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
