"""gnsq's HTTP publisher (`gnsq.NsqdHTTPClient`) against an nsqd; run by test_http_interop.py.

    python -m tests.nsqd_http.gnsq_http_publish --port HTTP_PORT --topic T

gnsq runs under gevent, which monkey-patches the standard library, so it gets a process of
its own. It publishes with `publish` (plain and deferred) and `multipublish` (text and binary
mode), reads `/info` and `/stats`, then tries one publish nsqd must refuse, and prints what
each call returned as one JSON line.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402

import gnsq  # noqa: E402
import gnsq.errors  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    client = gnsq.NsqdHTTPClient("127.0.0.1", args.port)
    topic = args.topic
    results = {
        "publish": client.publish(topic, b"gnsq pub").decode(),
        "publish_defer": client.publish(topic, b"gnsq deferred", defer=50).decode(),
        "multipublish": client.multipublish(topic, [b"gnsq m1", b"gnsq m2"]).decode(),
        "multipublish_binary": client.multipublish(
            topic, [b"gnsq b1\nwith newline", b"gnsq b2"], binary=True
        ).decode(),
        "ping": client.ping().decode(),
        "info_version": client.info()["version"],
    }
    (topic_stats,) = client.stats(topic=topic)["topics"]
    results["message_count"] = topic_stats["message_count"]
    try:
        client.publish(topic, b"")
        results["empty"] = "accepted"
    except gnsq.errors.NSQHttpError as error:
        results["empty"] = str(error)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
