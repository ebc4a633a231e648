"""Delayed messages: DPUB and REQ-with-delay rates, due messages returning, and nsqd's memory
with many delayed, on a log topic (the partition's delay queue, nsqd/delay_queue.py) against
a classic topic (Go's in-memory deferred queue).

    .venv/bin/python -m bench.delay_queue [--count 1000000] [--runs 3] [--quick]

Each run starts a fresh nsqd (`--max-req-timeout=24h`) with channel `c` and, for the log
topic, `--log-topic=lt --req-to-end-threshold=1s`:

* **DPUB**: `--count` DPUBs of 100 bytes, 1 h delay, pipelined on 4 connections (a window of
  200 unanswered each); msgs/s until the last OK; then VmRSS (after nsqd's sync) against the
  idle process before;
* **REQ with a delay**: 100,000 messages published, then a consumer REQs each with 60 s;
  msgs/s from the first delivery to the channel's count of delayed reaching them all;
* **due returning**: 100,000 DPUBs of 2 s; msgs/s a consumer receives them at once due (from
  the first to the last, after the first came).
"""

import argparse
import socket
import threading
import time
import urllib.request

from bench._support import (
    MIB,
    Nsqd,
    Record,
    Report,
    add_common_arguments,
    banner,
    load_average,
    runs_of,
    spread,
)
from nsqpy.common.command import MAGIC_V2
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameDecoder
from nsqpy.common.message import decode_message

BODY = b"x" * 100
WINDOW = 200
CONNECTIONS = 4


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(MAGIC_V2)
    return sock


def dpub_many(port: int, topic: str, count: int, delay_ms: int) -> float:
    """Seconds to have `count` DPUBs answered OK, over CONNECTIONS pipelined connections."""
    command = b"DPUB %s %d\n" % (topic.encode(), delay_ms) + len(BODY).to_bytes(4, "big") + BODY
    errors: list[str] = []

    def one(share: int) -> None:
        sock = _connect(port)
        decoder = FrameDecoder()
        sent = answered = 0
        while answered < share:
            burst = min(WINDOW - (sent - answered), share - sent)
            if burst > 0:
                sock.sendall(command * burst)
                sent += burst
            for frame in decoder.receive_data(sock.recv(65536)):
                if frame.data == b"_heartbeat_":
                    sock.sendall(b"NOP\n")
                    continue
                if frame.frame_type != FRAME_TYPE_RESPONSE or frame.data != b"OK":
                    errors.append(bytes(frame.data).decode(errors="replace"))
                    return
                answered += 1
        sock.close()

    shares = [count // CONNECTIONS + (index < count % CONNECTIONS) for index in range(CONNECTIONS)]
    threads = [threading.Thread(target=one, args=(share,)) for share in shares]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"DPUB refused: {errors[0]}")
    return time.perf_counter() - start


def mpub_many(port: int, topic: str, count: int) -> None:
    sock = _connect(port)
    decoder = FrameDecoder()
    for start in range(0, count, 200):
        batch = min(200, count - start)
        payload = batch.to_bytes(4, "big") + (len(BODY).to_bytes(4, "big") + BODY) * batch
        sock.sendall(b"MPUB %s\n" % topic.encode() + len(payload).to_bytes(4, "big") + payload)
        frames: list = []
        while not frames:
            frames = [
                frame
                for frame in decoder.receive_data(sock.recv(65536))
                if frame.data != b"_heartbeat_"
            ]
        assert frames[0].data == b"OK", frames[0].data
    sock.close()


def consume(port: int, topic: str, count: int, reply) -> tuple[float, float]:
    """Receive `count` messages of topic:c, answering each with `reply(id)`; (the time the
    first came, the time the last came)."""
    sock = _connect(port)
    decoder = FrameDecoder()
    sock.sendall(b"SUB %s c\nRDY 2500\n" % topic.encode())
    received = 0
    first = 0.0
    while received < count:
        answers = []
        for frame in decoder.receive_data(sock.recv(262144)):
            if frame.data == b"_heartbeat_":
                answers.append(b"NOP\n")
            elif frame.frame_type == FRAME_TYPE_MESSAGE:
                if not received:
                    first = time.perf_counter()
                received += 1
                answers.append(reply(decode_message(frame.data).id))
        if answers:
            sock.sendall(b"".join(answers))
    last = time.perf_counter()
    sock.close()
    return first, last


def channel_stats(nsqd: Nsqd, topic: str) -> dict:
    (entry,) = nsqd.stats(topic)["topics"]
    (channel,) = entry["channels"]
    return channel


def create(nsqd: Nsqd, topic: str) -> None:
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=c"):
        request = urllib.request.Request(f"http://127.0.0.1:{nsqd.http_port}{path}", method="POST")
        urllib.request.urlopen(request, timeout=10).read()


def wait_for(check, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def waiting(nsqd: Nsqd, topic: str) -> int:
    """Delayed messages the channel holds: in the delay queue, and deferred in memory."""
    stats = channel_stats(nsqd, topic)
    return stats.get("delayed_queue_count", 0) + stats["deferred_count"]


def one_run(kind: str, count: int, req_count: int) -> dict[str, float]:
    topic = "lt" if kind == "log" else "ct"
    extra = ["-max-req-timeout=24h", "-sync-timeout=200ms"]
    if kind == "log":
        extra += ["-log-topic=lt", "-req-to-end-threshold=1s"]
    figures = {}
    with Nsqd(extra) as nsqd:
        create(nsqd, topic)
        time.sleep(0.5)  # idle: the figure every RSS is measured against
        idle = nsqd.memory()["VmRSS"]
        seconds = dpub_many(nsqd.port, topic, count, 3_600_000)
        figures["dpub"] = count / seconds
        wait_for(lambda: waiting(nsqd, topic) == count, f"{count:,} delayed")
        time.sleep(1.0)  # a sync (200 ms) and the allocator settle
        figures["rss"] = (nsqd.memory()["VmRSS"] - idle) / MIB
    with Nsqd(extra) as nsqd:
        create(nsqd, topic)
        mpub_many(nsqd.port, topic, req_count)
        first, _last = consume(
            nsqd.port, topic, req_count, lambda message_id: b"REQ " + message_id + b" 60000\n"
        )
        wait_for(lambda: waiting(nsqd, topic) == req_count, "every REQ delayed")
        figures["req"] = req_count / (time.perf_counter() - first)
        dpub_many(nsqd.port, topic, req_count, 2000)
        first, last = consume(
            nsqd.port, topic, req_count, lambda message_id: b"FIN " + message_id + b"\n"
        )
        figures["due"] = req_count / max(last - first, 1e-6)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="DPUBs for the RSS figure")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    count = 100_000 if args.quick else args.count
    req_count = 20_000 if args.quick else 100_000
    banner(
        "delayed messages (bench.delay_queue)",
        f"{count:,} DPUBs of 1 h; {req_count:,} REQs of 60 s; {req_count:,} DPUBs of 2 s"
        f" returning; log topic against classic topic; {runs} run(s)",
    )
    report = Report(args.json)
    results: dict[str, dict[str, list[float]]] = {"log": {}, "classic": {}}
    for run in range(runs):
        for kind in ("log", "classic") if run % 2 == 0 else ("classic", "log"):
            figures = one_run(kind, count, req_count)
            for name, value in figures.items():
                results[kind].setdefault(name, []).append(value)
            print(
                f"  run {run + 1} {kind}: DPUB {figures['dpub']:,.0f} msgs/s,"
                f" RSS +{figures['rss']:.1f} MiB with {count:,} delayed;"
                f" REQ {figures['req']:,.0f} msgs/s; due {figures['due']:,.0f} msgs/s",
                flush=True,
            )
    loads = [load_average()] * runs
    names = {
        "dpub": ("DPUB of 1 h", "msgs/s"),
        "rss": (f"RSS added by {count:,} delayed messages", "MiB"),
        "req": ("REQ with 60 s", "msgs/s"),
        "due": ("due DPUBs returning", "msgs/s"),
    }
    for kind, figures in results.items():
        for name, values in figures.items():
            label, unit = names[name]
            shape = ",.1f" if unit == "MiB" else ",.0f"
            print(f"  {kind} topic, {label}: {spread(values, shape)} {unit}")
            report.add(Record("delay_queue", f"{kind} topic: {label}", unit, values, loads))
    report.write()


if __name__ == "__main__":
    main()
