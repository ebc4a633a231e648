"""The clients of the network fault tests, inside the client's namespace
(`tests/cluster/netns.py`): the test talks to it over its stdin and stdout, a JSON object a line
each way, since nothing in the host's namespace can reach the cluster.

Requests:
* `{"op": "http", "method", "url"}`: one HTTP request; `{"status", "body"}` or `{"error"}`;
* `{"op": "start", "lookupd", "topics": {name: ordered}}`: per topic a SmartProducer thread
  publishing numbered messages one after another, and a SmartConsumer of channel `c`
  (`SUB_ORDERED` for an ordered topic, whose producer publishes to partition 0);
* `{"op": "first_ack_after", "at"}`: per topic, the first acknowledgement at or after
  `at` (time.monotonic, the same clock as the test's), or null;
* `{"op": "finish", "timeout"}`: stop publishing, wait until every acknowledged message was
  consumed; per topic how many were acknowledged, which were lost, the duplicates, and
  whether first deliveries came in publishing order.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

from nsqpy.client.blocking import NSQError
from nsqpy.client.smart import SmartClientError, SmartConsumer, SmartProducer


class TopicTraffic:
    def __init__(self, lookupd: str, topic: str, ordered: bool) -> None:
        self.topic = topic
        self.ordered = ordered
        self.lookupd = lookupd
        self.acked: list[tuple[float, int]] = []
        self.acked_wall: dict[int, str] = {}
        self.failed = 0
        self.received: Counter = Counter()
        self.first: list[int] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.consumer = SmartConsumer(
            lookupd,
            topic,
            "c",
            self._handle,
            max_in_flight=50,
            ordered=ordered,
            lookup_interval=1.0,
            backoff_max=0.5,
        )
        self.thread = threading.Thread(target=self._produce, daemon=True)
        self.thread.start()

    def _handle(self, message) -> None:
        sequence = int(message.body.split(b"-")[1])
        with self.lock:
            if sequence not in self.received:
                self.first.append(sequence)
            self.received[sequence] += 1

    def _produce(self) -> None:
        sequence = 0
        partition = 0 if self.ordered else None
        with SmartProducer(
            self.lookupd, publish_timeout=5, timeout=3, lookup_interval=1.0
        ) as producer:
            while not self.stop.is_set():
                body = b"%s-%08d" % (self.topic.encode(), sequence)
                try:
                    published = producer.publish(self.topic, body, partition=partition)
                except (SmartClientError, NSQError, OSError):
                    with self.lock:
                        self.failed += 1
                else:
                    with self.lock:
                        self.acked.append((time.monotonic(), sequence))
                        self.acked_wall[sequence] = (
                            time.strftime("%H:%M:%S")
                            + ("%.3f" % (time.time() % 1))[1:]
                            + f" at {published.address}, attempt {published.attempts}"
                        )
                sequence += 1
                time.sleep(0.005)

    def first_ack_after(self, moment: float) -> float | None:
        with self.lock:
            return next((at for at, _sequence in self.acked if at >= moment), None)

    def finish(self, timeout: float) -> dict:
        self.stop.set()
        self.thread.join(30)
        with self.lock:
            acked = {sequence for _at, sequence in self.acked}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                missing = acked - set(self.received)
            if not missing:
                break
            time.sleep(0.1)
        self.consumer.close()
        with self.lock:
            missing = sorted(acked - set(self.received))
            return {
                "acknowledged": len(acked),
                "failed": self.failed,
                "lost": len(missing),
                "lost_first": missing[:10],
                "lost_acked_at": [self.acked_wall.get(sequence) for sequence in missing[:10]],
                "duplicates": sum(count - 1 for count in self.received.values()),
                "in_order": self.first == sorted(self.first),
            }


def http(method: str, url: str) -> dict:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            return {"status": response.status, "body": response.read().decode()}
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": error.read().decode()}
    except OSError as error:
        return {"error": str(error)}


def main() -> None:
    traffic: dict[str, TopicTraffic] = {}
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "http":
            answer = http(request.get("method", "GET"), request["url"])
        elif op == "start":
            for topic, ordered in request["topics"].items():
                traffic[topic] = TopicTraffic(request["lookupd"], topic, ordered)
            answer = {"ok": True}
        elif op == "first_ack_after":
            answer = {t: flow.first_ack_after(request["at"]) for t, flow in traffic.items()}
        elif op == "finish":
            answer = {t: flow.finish(request["timeout"]) for t, flow in traffic.items()}
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
