"""nsq_to_http: send every message of a topic to HTTP endpoints, as Go's `nsq_to_http` does.

`--post URL` sends the body as a POST (`--content-type`, `--header`); `--get URL` sends a GET,
with `%s` in the URL replaced by the URL-escaped body. `--mode` chooses the endpoint:
`round-robin` takes each in turn, `hostpool` and `epsilon-greedy` (Go's host pools) take them
in turn too and fall back to the next one when one fails, and `fan-out` (Go's old broadcast
behaviour) sends every message to every endpoint. A message is FINished once its request(s)
got a 2xx answer and REQueued otherwise. `-n` requests run at once.
"""

import itertools
import queue
import random
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

from nsqpy.common.flags import Flag, Kind
from nsqpy.tools._common import (
    WAKE_INTERVAL,
    ConsumerGroup,
    Progress,
    StopFlag,
    address_flags,
    check_sources,
    consumer_opt_flag,
    fatal,
    log_flags,
    make_logger,
    parse_args,
    settle,
)
from nsqpy.tools._options import consumer_settings

NAME = "nsq_to_http"
MODES = ("round-robin", "hostpool", "epsilon-greedy", "fan-out")


def flags() -> list[Flag]:
    return [
        Flag("topic", Kind.STRING, "", "nsq topic"),
        Flag("channel", Kind.STRING, "nsq_to_http", "nsq channel"),
        Flag("max-in-flight", Kind.INT, 200, "max number of messages to allow in flight"),
        Flag("n", Kind.INT, 100, "number of concurrent publishers"),
        Flag(
            "mode",
            Kind.STRING,
            "hostpool",
            "the upstream request mode options: round-robin, hostpool (default), "
            "epsilon-greedy, fan-out",
        ),
        Flag("sample", Kind.FLOAT, 1.0, "% of messages to publish (float b/w 0 -> 1)"),
        Flag("http-client-connect-timeout", Kind.DURATION, 2.0, "timeout for HTTP connect"),
        Flag("http-client-request-timeout", Kind.DURATION, 20.0, "timeout for HTTP request"),
        Flag(
            "status-every",
            Kind.INT,
            250,
            "the # of requests between logging status (per handler), 0 disables",
        ),
        Flag(
            "content-type",
            Kind.STRING,
            "application/octet-stream",
            "the Content-Type used for POST requests",
        ),
        Flag(
            "get",
            Kind.STRING_LIST,
            (),
            "HTTP address to make a GET request to. '%s' will be printf replaced with data "
            "(may be given multiple times)",
        ),
        Flag(
            "post",
            Kind.STRING_LIST,
            (),
            "HTTP address to make a POST request to.  data will be in the body (may be given "
            "multiple times)",
        ),
        Flag(
            "header",
            Kind.STRING_LIST,
            (),
            "Custom header for HTTP requests (may be given multiple times)",
        ),
        *address_flags(),
        consumer_opt_flag(),
        *log_flags(NAME),
    ]


class Endpoints:
    """The upstream URLs and how a message picks among them."""

    def __init__(self, method: str, urls: list[str], mode: str, headers: dict, timeout: float):
        self.method = method
        self.urls = urls
        self.mode = mode
        self.headers = headers
        self.timeout = timeout
        self._turn = itertools.cycle(range(len(urls)))
        self._lock = threading.Lock()

    def deliver(self, body: bytes) -> str | None:
        """Send `body`; None when it was delivered, else why not."""
        if self.mode == "fan-out":
            errors = [e for e in (self._request(url, body) for url in self.urls) if e]
            return "; ".join(errors) or None
        with self._lock:
            first = next(self._turn)
        if self.mode == "round-robin":
            return self._request(self.urls[first], body)
        error = None
        for offset in range(len(self.urls)):
            error = self._request(self.urls[(first + offset) % len(self.urls)], body)
            if error is None:
                return None
        return error

    def _request(self, url: str, body: bytes) -> str | None:
        if self.method == "GET":
            if "%s" in url:
                url = url.replace("%s", urllib.parse.quote_plus(body), 1)
            request = urllib.request.Request(url, method="GET", headers=self.headers)
        else:
            request = urllib.request.Request(url, data=body, method="POST", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except OSError as error:
            return f"{url}: {error}"
        if 200 <= status < 300:
            return None
        return f"{url}: got status code {status}"


def parse_headers(values: list[str]) -> dict:
    headers = {}
    for header in values:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"invalid --header value {header!r}, expected 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    topic = values["topic"]
    if not topic:
        fatal(log, "--topic is required")
    check_sources(log, values)
    settings = consumer_settings(log, values, f"{NAME}/nsqpy")
    gets, posts = list(values["get"]), list(values["post"])
    if not gets and not posts:
        fatal(log, "--get or --post required")
    if gets and posts:
        fatal(log, "use --get or --post not both")
    if values["mode"] not in MODES:
        fatal(log, "invalid --mode %r (one of %s)", values["mode"], ", ".join(MODES))
    if not 0.0 < values["sample"] <= 1.0:
        fatal(log, "ERROR: --sample must be between 0.0 and 1.0")
    if values["n"] < 1:
        fatal(log, "-n must be at least 1")
    try:
        headers = parse_headers(values["header"])
    except ValueError as error:
        fatal(log, "%s", error)
    headers.setdefault("User-Agent", f"{NAME}/nsqpy")
    if posts:
        headers.setdefault("Content-Type", values["content_type"])
    endpoints = Endpoints(
        "POST" if posts else "GET",
        posts or gets,
        values["mode"],
        headers,
        values["http_client_request_timeout"],
    )
    stop = StopFlag()
    group = ConsumerGroup(
        [topic],
        values["channel"],
        nsqd_tcp_addresses=values["nsqd_tcp_address"],
        lookupd_http_addresses=values["lookupd_http_address"],
        log=log,
        **settings,
    )
    progress = Progress()
    # Workers deliver; only this thread talks to nsqd (FIN/REQ), from the results queue.
    work: queue.Queue = queue.Queue()
    results: queue.Queue = queue.Queue()

    def worker() -> None:
        while (message := work.get()) is not None:
            results.put((message, endpoints.deliver(message.body)))

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(values["n"])]
    for thread in workers:
        thread.start()
    outstanding = 0

    def answer(block: bool) -> None:
        nonlocal outstanding
        while outstanding:
            try:
                message, error = (
                    results.get(timeout=WAKE_INTERVAL) if block else results.get_nowait()
                )
            except queue.Empty:
                return
            outstanding -= 1
            settle(
                group,
                message,
                error,
                progress=progress,
                log=log,
                status_every=values["status_every"],
                done="delivered",
            )

    def dispatch(message) -> None:
        nonlocal outstanding
        if values["sample"] < 1.0 and random.random() > values["sample"]:
            group.finish(message)
            return
        outstanding += 1
        work.put(message)

    try:
        while not stop:
            answer(block=False)
            message = group.receive(timeout=0.05 if outstanding else WAKE_INTERVAL)
            if message is not None:
                dispatch(message)
        group.start_close()
        for message in group.drain():
            dispatch(message)
        while outstanding:
            answer(block=True)
    finally:
        for _thread in workers:
            work.put(None)
        progress.close()
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
