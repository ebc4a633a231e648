"""Topics and channels made one after another: whether each costs the same at 5,000 as at 100,
and `/stats` at that size.

    .venv/bin/python -m bench.topic_creation [--topics 100,1000,5000] [--runs 1]
        [--reference ../go/nsqd]

One HTTP client on one keep-alive connection: for each of N topics, `POST /topic/create`, then
`POST /channel/create` of two channels. Figures: the seconds all of it took, creations a second
(a topic or a channel each), the median of five `GET /stats?format=json` at the end, and
nsqd's RSS then. With `--reference`, Go's nsqd (or another tree's) runs the same in the same
invocation.
"""

import argparse
import http.client
import json
import statistics
import sys
import time

from bench._support import (
    MIB,
    Nsqd,
    Report,
    add_common_arguments,
    banner,
    record_against_reference,
    runs_of,
)

CHANNELS = ("c0", "c1")


def _post(connection: http.client.HTTPConnection, path: str) -> None:
    connection.request("POST", path)
    reply = connection.getresponse()
    body = reply.read()
    if reply.status != 200:
        raise RuntimeError(f"{path}: {reply.status} {body!r}")


def create_all(nsqd: Nsqd, topics: int) -> dict:
    """The creations, then five /stats; the figures but RSS."""
    connection = http.client.HTTPConnection("127.0.0.1", nsqd.http_port, timeout=60)
    started = time.perf_counter()
    for index in range(topics):
        _post(connection, f"/topic/create?topic=t{index}")
        for channel in CHANNELS:
            _post(connection, f"/channel/create?topic=t{index}&channel={channel}")
    elapsed = time.perf_counter() - started
    stats_times = []
    for _ in range(5):
        begun = time.perf_counter()
        connection.request("GET", "/stats?format=json")
        reply = connection.getresponse()
        document = json.loads(reply.read())
        stats_times.append(time.perf_counter() - begun)
    if len(document["topics"]) != topics:
        raise RuntimeError(f"/stats shows {len(document['topics'])} topics of {topics}")
    connection.close()
    creations = topics * (1 + len(CHANNELS))
    return {
        "seconds": elapsed,
        "creations_per_s": creations / elapsed,
        "stats_ms": statistics.median(stats_times) * 1000,
    }


def run_once(topics: int) -> dict:
    with Nsqd() as nsqd:
        result = create_all(nsqd, topics)
        nsqd.check_alive()
        result["rss_mib"] = nsqd.memory()["VmRSS"] / MIB
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default="100,1000,5000", help="comma-separated sizes")
    add_common_arguments(parser, runs=1, reference=True)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    sizes = [int(size) for size in args.topics.split(",")]
    banner(
        "topic creation (bench.topic_creation)",
        f"N topics x {len(CHANNELS)} channels over HTTP, N = {args.topics}; {runs} run(s)",
    )
    report = Report(args.json)
    for size in sizes:
        record_against_reference(
            report,
            "topic_creation",
            args,
            lambda size=size: run_once(size),
            lambda label, key, size=size: (
                f"{size} topics x {len(CHANNELS)} channels, {label}: {key}"
            ),
            (("seconds", "s"), ("stats_ms", "ms"), ("rss_mib", "MiB")),
            label=f"N={size} ",
        )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
