"""Seeded `kill -9` trials against a real nsqd process, for tests/reliability/test_crash.py.

One run is a chain of trials on one data directory. In each trial a consumer thread is
subscribed (it FINs every message as it arrives), a publisher thread streams numbered
messages over TCP (a seeded mix of PUB and MPUB, several commands pipelined) and records which
ones got `OK`, and nsqd is killed with SIGKILL at a seeded-random moment: once the publisher
holds a random number of `OK`s (or, with churn, once the churn thread had a random number of
HTTP answers). nsqd is then started again on the same data directory, and the next trial's
consumer first drains the channel (until `/stats` shows nothing queued, in flight or
deferred), which settles the killed trial: an acknowledged number seen by no consumer, before
or after the kill, is lost. Only then does the next trial publish. The last restart is drained
the same way and stopped with SIGTERM, which must exit 0.

Every message body is `<number>:<filler>` with a filler derived from the number, so a
delivered body that was corrupted or never sent is caught too.

With `churn`, a third thread creates and deletes topics and channels over HTTP the whole time,
so nsqd.dat is rewritten constantly, and pauses or unpauses a marker topic now and then. Each
such change is journaled before its `200` (nsqd/metadata_journal.py), so what is provable
after a kill is every answer: each topic and channel is as the last answered create or delete
left it, and the marker's paused flag is the last answered one. Only the request in flight
when nsqd died may or may not have taken effect.
"""

import functools
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from nsqpy.common.command import (
    MAGIC_V2,
    NOP,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message
from tests.harness import DaemonProcess, start_nsqd
from tests.support.polling import poll

TOPIC = "crash"
CHANNEL = "c"
MARKER_TOPIC = "marker"
HEARTBEAT = b"_heartbeat_"


# -- messages -----------------------------------------------------------------------------------


def body_of(number: int, size: int) -> bytes:
    """`<number>:<filler>`, `size` bytes at least; the filler is a function of the number."""
    head = b"%d:" % number
    pattern = b"%08x" % (number * 2654435761 % 2**32)
    filler_size = max(0, size - len(head))
    return head + (pattern * (filler_size // 8 + 1))[:filler_size]


def number_of(body: bytes) -> int:
    """The number in a body; AssertionError if the body is not exactly one we could send."""
    head, _, filler = body.partition(b":")
    number = int(head)
    assert body == body_of(number, len(body)), f"corrupt body {body[:60]!r}"
    assert filler or len(body) == len(head) + 1
    return number


# -- scenarios and results ---------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One kind of trial: nsqd's flags and what the kills may cost."""

    name: str
    flags: tuple[str, ...]
    #: Every acknowledged message must come back (`--mem-queue-size=0 --sync-every=1`).
    lossless: bool
    #: `--mem-queue-size` in effect: what a kill may take from memory, per queue.
    mem_queue_size: int
    #: The kill comes after this many `OK`ed messages (inclusive range, seeded).
    kill_after: tuple[int, int] = (20, 200)
    #: Message body sizes (inclusive range, seeded per message).
    body_size: tuple[int, int] = (8, 120)
    #: The consumer's RDY (inclusive range, seeded per trial).
    ready: tuple[int, int] = (1, 50)
    #: Topics and channels created and deleted meanwhile; the kill comes after this many
    #: churn answers (inclusive range) instead of after `kill_after` acks.
    churn: tuple[int, int] | None = None


@dataclass
class TrialResult:
    trial: int
    kill_after: int
    ready: int
    sent: int = 0
    acked: int = 0
    delivered: int = 0
    lost: int = 0
    #: Most a kill may lose: mem-queue-size per queue (topic and channel) plus what the
    #: consumer's RDY lets be taken from the queues but not yet written to the socket.
    bound: int = 0
    churn_ops: int = 0
    #: Topics, channels and pause flags whose state after the restart is provable, checked.
    metadata_checked: int = 0


@dataclass
class Report:
    scenario: Scenario
    seed: int
    trials: list[TrialResult] = field(default_factory=list)
    deliveries: int = 0
    redelivered: int = 0
    bad_files: int = 0
    #: Restart log lines where a queue's write file was found past its metadata (a kill
    #: between a write and the sync that records it, or in the middle of a roll).
    write_file_skips: int = 0
    #: Temporary metadata files a kill left behind, kills that landed in the middle of a
    #: metadata write: of nsqd.dat (`nsqd.dat.*.tmp`) and of queues (`*.meta.dat.*.tmp`).
    cut_nsqd_dat_writes: int = 0
    cut_queue_metadata_writes: int = 0
    wall_seconds: float = 0.0

    def total(self, name: str) -> int:
        return sum(getattr(trial, name) for trial in self.trials)

    @property
    def max_lost_in_a_trial(self) -> int:
        return max((trial.lost for trial in self.trials), default=0)

    @property
    def bound_text(self) -> str:
        if self.scenario.lossless:
            return "0"
        return f"2 x {self.scenario.mem_queue_size} + RDY"

    def line(self) -> str:
        text = (
            f"{self.scenario.name}: {len(self.trials)} kill -9 trials (seed {self.seed}),"
            f" {self.total('sent')} sent, {self.total('acked')} acked,"
            f" {self.total('delivered')} acked delivered, {self.total('lost')} lost"
            f" (max {self.max_lost_in_a_trial} in a trial, bound {self.bound_text}),"
            f" {self.redelivered} redeliveries, {self.bad_files} .bad files,"
            f" {self.write_file_skips} write-file skips at restart,"
            f" metadata writes cut short: {self.cut_nsqd_dat_writes} of nsqd.dat,"
            f" {self.cut_queue_metadata_writes} of queues"
        )
        if self.scenario.churn:
            text += (
                f", {self.total('churn_ops')} topic/channel ops,"
                f" {self.total('metadata_checked')} provable states checked"
            )
        return text + f", {self.wall_seconds:.1f}s"


# -- the consumer --------------------------------------------------------------------------------


class Ledger:
    """Every delivery any consumer saw, by number, shared between threads."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.seen: Counter[int] = Counter()

    def record(self, numbers: list[int]) -> None:
        with self.lock:
            self.seen.update(numbers)
            self.lock.notify_all()

    def wait_for_all(self, numbers: set[int], timeout: float) -> bool:
        """Wait until every one of `numbers` was seen; False after `timeout`."""
        with self.lock:
            return self.lock.wait_for(lambda: numbers.issubset(self.seen.keys()), timeout)

    def seen_numbers(self) -> set[int]:
        with self.lock:
            return set(self.seen)


class ConsumerThread(threading.Thread):
    """SUB, RDY, then FIN every message as it arrives (after recording it), until nsqd
    goes away or `stop()`; heartbeats are answered."""

    def __init__(self, port: int, ready: int, ledger: Ledger) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ledger = ledger
        self.decoder = FrameDecoder()
        self.errors: list[bytes] = []
        self.failure: BaseException | None = None
        self.sock.sendall(MAGIC_V2 + encode_sub(TOPIC, CHANNEL))
        pending = []
        while not pending:
            data = self.sock.recv(65536)
            assert data, "nsqd closed the consumer's connection before answering SUB"
            pending = self.decoder.receive_data(data)
        assert pending[0].data == b"OK", pending[0]
        self.sock.sendall(encode_rdy(ready))
        self.sock.settimeout(None)

    def run(self) -> None:
        try:
            while True:
                try:
                    data = self.sock.recv(256 * 1024)
                except OSError:
                    return  # reset by the kill, or shut down by stop()
                if not data:
                    return
                replies = []
                numbers = []
                for frame in self.decoder.receive_data(data):
                    if frame.frame_type == FRAME_TYPE_MESSAGE:
                        message = decode_message(frame.data)
                        numbers.append(number_of(message.body))
                        replies.append(encode_fin(message.id))
                    elif frame.frame_type == FRAME_TYPE_ERROR:
                        self.errors.append(frame.data)
                    elif frame.data == HEARTBEAT:
                        replies.append(NOP)
                self.ledger.record(numbers)
                if replies:
                    try:
                        self.sock.sendall(b"".join(replies))
                    except OSError:
                        pass  # nsqd is gone; keep reading what it sent before
        except BaseException as error:  # noqa: BLE001 - reported by stop()
            self.failure = error

    def stop(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.join(30)
        self.sock.close()
        assert not self.is_alive(), "consumer thread did not stop"
        if self.failure is not None:
            raise self.failure
        assert self.errors == [], f"nsqd sent the consumer errors: {self.errors[:5]}"


# -- the publisher -------------------------------------------------------------------------------


class PublisherThread(threading.Thread):
    """Streams numbered messages until nsqd goes away: PUB or MPUB (seeded), up to `window`
    commands pipelined. Every `OK` read, even after the kill was sent (nsqd wrote it before
    it died), acknowledges its command's numbers."""

    def __init__(
        self,
        port: int,
        rng: random.Random,
        first_number: int,
        body_size: tuple[int, int],
        kill_when_acked: int | None,
        kill_now: threading.Event,
        limit: int = 1_000_000,
    ) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(MAGIC_V2)
        self.rng = random.Random(rng.getrandbits(64))
        self.next_number = first_number
        self.body_size = body_size
        self.window = self.rng.randint(1, 12)
        self.kill_when_acked = kill_when_acked
        self.kill_now = kill_now
        self.limit = limit
        self.sent: list[int] = []
        self.acked: list[int] = []
        self.errors: list[bytes] = []
        self.failure: BaseException | None = None

    def _command(self) -> tuple[bytes, list[int]]:
        rng = self.rng
        count = 1 if rng.random() < 0.5 else rng.randint(2, 20)
        numbers = list(range(self.next_number, self.next_number + count))
        self.next_number += count
        bodies = [body_of(n, rng.randint(*self.body_size)) for n in numbers]
        command = encode_pub(TOPIC, bodies[0]) if count == 1 else encode_mpub(TOPIC, bodies)
        return command, numbers

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001 - reported by the runner
            self.failure = error
        finally:
            self.sock.close()

    def _run(self) -> None:
        decoder = FrameDecoder()
        outstanding: deque[list[int]] = deque()
        can_send = True
        while True:
            while can_send and len(outstanding) < self.window and len(self.sent) < self.limit:
                command, numbers = self._command()
                try:
                    self.sock.sendall(command)
                except OSError:
                    can_send = False  # nsqd died; OKs it sent may still wait to be read
                    break
                outstanding.append(numbers)
                self.sent.extend(numbers)
            if not outstanding:
                return
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            for frame in decoder.receive_data(data):
                if frame.frame_type == FRAME_TYPE_ERROR:
                    self.errors.append(frame.data)
                    outstanding.popleft()
                elif frame.data == HEARTBEAT:
                    self.sock.sendall(NOP)
                else:
                    assert frame.data == b"OK", frame.data
                    self.acked.extend(outstanding.popleft())
            if self.kill_when_acked is not None and len(self.acked) >= self.kill_when_acked:
                self.kill_now.set()


# -- topic and channel churn ---------------------------------------------------------------------


def _http(port: int, method: str, path: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if method == "POST":
        request.data = b""
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def stats(port: int) -> dict:
    url = f"http://127.0.0.1:{port}/stats?format=json"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def topology(port: int) -> dict[str, bool]:
    """`{"topic": True, "topic:channel": True}` for what exists, and `"marker?paused"` with
    the marker topic's paused flag."""
    state: dict[str, bool] = {}
    for topic in stats(port)["topics"]:
        state[topic["topic_name"]] = True
        if topic["topic_name"] == MARKER_TOPIC:
            state[f"{MARKER_TOPIC}?paused"] = topic["paused"]
        for channel in topic["channels"]:
            state[f"{topic['topic_name']}:{channel['channel_name']}"] = True
    return state


class ChurnThread(threading.Thread):
    """Creates and deletes topics and channels over HTTP until nsqd goes away, pausing or
    unpausing the marker topic now and then: nsqd.dat is rewritten all the time.

    `known` is the state the answered requests left; `uncertain` holds the keys of the
    request nsqd did not answer: every other one is provable after a kill (see the module
    docstring)."""

    def __init__(
        self,
        port: int,
        rng: random.Random,
        trial: int,
        known: dict[str, bool],
        kill_after_ops: int | None,
        kill_now: threading.Event,
    ) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.rng = random.Random(rng.getrandbits(64))
        self.trial = trial
        self.known = dict(known)
        self.uncertain: set[str] = set()
        self.kill_after_ops = kill_after_ops
        self.kill_now = kill_now
        self.ops = 0
        self.failure: BaseException | None = None

    def _live_topics(self) -> list[str]:
        return sorted(
            k for k, v in self.known.items() if v and ":" not in k and k.startswith("churn")
        )

    def _next_op(self, serial: int) -> tuple[str, str, list[str], dict[str, bool]]:
        """(method, path, keys it touches, state the 200 leaves)."""
        rng = self.rng
        topics = self._live_topics()
        channels = sorted(
            k for k, v in self.known.items() if v and k.startswith("churn") and ":" in k
        )
        if not self.known.get(MARKER_TOPIC):
            path = f"/topic/create?topic={MARKER_TOPIC}"
            return "POST", path, [MARKER_TOPIC], {MARKER_TOPIC: True}
        choice = rng.random()
        if choice < 0.15:
            paused = not self.known.get(f"{MARKER_TOPIC}?paused", False)
            action = "pause" if paused else "unpause"
            return (
                "POST",
                f"/topic/{action}?topic={MARKER_TOPIC}",
                [MARKER_TOPIC, f"{MARKER_TOPIC}?paused"],
                {MARKER_TOPIC: True, f"{MARKER_TOPIC}?paused": paused},
            )
        if topics and (choice < 0.35 or len(topics) > 8):
            topic = rng.choice(topics)
            keys = [topic] + [k for k in self.known if k.startswith(topic + ":")]
            return "POST", f"/topic/delete?topic={topic}", keys, dict.fromkeys(keys, False)
        if channels and choice < 0.5:
            key = rng.choice(channels)
            topic, channel = key.split(":")
            return "POST", f"/channel/delete?topic={topic}&channel={channel}", [key], {key: False}
        if topics and choice < 0.75:
            topic = rng.choice(topics)
            key = f"{topic}:ch{serial}"
            path = f"/channel/create?topic={topic}&channel=ch{serial}"
            return "POST", path, [key], {key: True}
        topic = f"churn{self.trial}_{serial}"
        return "POST", f"/topic/create?topic={topic}", [topic], {topic: True}

    def run(self) -> None:
        serial = 0
        try:
            while True:
                serial += 1
                method, path, keys, after = self._next_op(serial)
                self.uncertain.update(keys)
                try:
                    status = _http(self.port, method, path)
                except (OSError, urllib.error.URLError):
                    return  # nsqd died: this request's keys stay uncertain
                assert status == 200, f"{path}: {status}"
                self.known.update(after)
                self.ops += 1
                # Journaled before the answer: it survives the kill.
                self.uncertain.difference_update(keys)
                if self.kill_after_ops is not None and self.ops >= self.kill_after_ops:
                    self.kill_now.set()
        except BaseException as error:  # noqa: BLE001 - reported by the runner
            self.failure = error

    def provable(self) -> dict[str, bool]:
        return {k: v for k, v in self.known.items() if k not in self.uncertain}


# -- the runner ----------------------------------------------------------------------------------


def drained(port: int) -> bool:
    """Nothing left to deliver nor to be FINished: the killed trial is settled."""
    for topic in stats(port)["topics"]:
        if topic["topic_name"] != TOPIC:
            continue
        if topic["depth"]:
            return False
        for channel in topic["channels"]:
            if channel["depth"] or channel["in_flight_count"] or channel["deferred_count"]:
                return False
    return True


def run_trials(
    scenario: Scenario, data_path: Path, trials: int, seed: int, drain_timeout: float = 120.0
) -> Report:
    """`trials` kill -9 trials of `scenario` chained on `data_path`; asserts as it goes
    (restart succeeds, losses within the scenario's bound, provable topology kept) and
    returns the figures."""
    started = time.monotonic()
    rng = random.Random(seed)
    report = Report(scenario, seed)
    ledger = Ledger()
    sent_all: set[int] = set()
    next_number = 0
    unsettled: tuple[TrialResult, list[int]] | None = None
    known: dict[str, bool] = {}
    daemon = start_nsqd(data_path, *scenario.flags)
    try:
        for trial in range(trials + 1):
            ready = rng.randint(*scenario.ready)
            consumer = ConsumerThread(daemon.port(), ready, ledger)
            consumer.start()
            if unsettled is not None:
                result, acked = unsettled
                if scenario.lossless:
                    # No need to poll nsqd before every acknowledged number is back.
                    ledger.wait_for_all(set(acked), drain_timeout)
                is_drained = functools.partial(drained, daemon.port("HTTP"))
                try:
                    poll(is_drained, "drained", timeout=drain_timeout)
                except AssertionError as error:
                    state = [
                        t for t in stats(daemon.port("HTTP"))["topics"] if t["topic_name"] == TOPIC
                    ]
                    tail = "\n".join(daemon.lines[-40:])
                    raise AssertionError(
                        f"{where(report, result)}: {error}; {state}\n{tail}"
                    ) from None
                settle(result, acked, ledger, report)
            if scenario.churn:
                known = check_topology(daemon, known, report)
            if trial == trials:
                consumer.stop()
                break

            kill_after = rng.randint(*scenario.kill_after)
            result = TrialResult(trial, kill_after, ready)
            result.bound = 0 if scenario.lossless else 2 * scenario.mem_queue_size + ready
            kill_now = threading.Event()
            churn = None
            if scenario.churn:
                churn_ops = rng.randint(*scenario.churn)
                churn = ChurnThread(daemon.port("HTTP"), rng, trial, known, churn_ops, kill_now)
            publisher = PublisherThread(
                daemon.port(),
                rng,
                next_number,
                scenario.body_size,
                None if churn else kill_after,
                kill_now,
                # With churn the kill waits for the churn ops; keep the queue bounded.
                limit=20 * scenario.kill_after[1] if churn else 10 * kill_after + 1000,
            )
            publisher.start()
            if churn:
                churn.start()
            if not kill_now.wait(120):
                failures = [publisher.failure, churn and churn.failure]
                raise AssertionError(f"trial {trial}: no kill in 120s: {failures}\n{daemon.log}")
            daemon.kill()
            report.write_file_skips += count_write_file_skips(daemon)
            publisher.join(60)
            consumer.stop()
            assert not publisher.is_alive(), "publisher thread did not stop"
            if publisher.failure is not None:
                raise publisher.failure
            assert publisher.errors == [], publisher.errors[:5]
            if churn is not None:
                churn.join(60)
                assert not churn.is_alive(), "churn thread did not stop"
                if churn.failure is not None:
                    raise churn.failure
                result.churn_ops = churn.ops
                known = churn.provable()
            next_number = publisher.next_number
            sent_all.update(publisher.sent)
            result.sent = len(publisher.sent)
            result.acked = len(publisher.acked)
            unsettled = (result, publisher.acked)
            # The restart on the same data directory must succeed.
            daemon = start_nsqd(data_path, *scenario.flags)
        assert daemon.stop() == 0, daemon.log
        report.write_file_skips += count_write_file_skips(daemon)
    finally:
        daemon.kill()
    phantoms = set(ledger.seen) - sent_all
    assert not phantoms, f"delivered numbers never sent: {sorted(phantoms)[:10]}"
    report.deliveries = sum(ledger.seen.values())
    report.redelivered = report.deliveries - len(ledger.seen)
    report.bad_files = len(list(data_path.glob("*.bad")))
    report.cut_nsqd_dat_writes = len(list(data_path.glob("nsqd.dat.*.tmp")))
    report.cut_queue_metadata_writes = len(list(data_path.glob("*.meta.dat.*.tmp")))
    report.wall_seconds = time.monotonic() - started
    return report


def count_write_file_skips(daemon: DaemonProcess) -> int:
    return sum("skipping to new file" in line for line in daemon.lines)


def where(report: Report, result: TrialResult) -> str:
    return f"{report.scenario.name} seed {report.seed} trial {result.trial}"


def settle(result: TrialResult, acked: list[int], ledger: Ledger, report: Report) -> None:
    """After the drain: the killed trial's acknowledged numbers nobody ever saw are lost."""
    seen = ledger.seen_numbers()
    lost = sorted(set(acked) - seen)
    result.delivered = len(acked) - len(lost)
    result.lost = len(lost)
    report.trials.append(result)
    trial = where(report, result)
    if report.scenario.lossless:
        assert not lost, f"{trial}: {len(lost)} acknowledged messages lost: {lost[:20]}"
    else:
        assert len(lost) <= result.bound, f"{trial}: {len(lost)} lost > bound {result.bound}"


def check_topology(daemon: DaemonProcess, known: dict[str, bool], report: Report) -> dict:
    """After a restart: every provable topic, channel and pause flag is as it was; returns
    the state now (the next trial's starting point)."""
    actual = topology(daemon.port("HTTP"))
    assert actual.get(TOPIC) and actual.get(f"{TOPIC}:{CHANNEL}"), sorted(actual)
    wrong = {k: (v, actual.get(k, False)) for k, v in known.items() if actual.get(k, False) != v}
    assert not wrong, f"provable state lost (key: (expected, found)): {wrong}"
    if report.trials:
        report.trials[-1].metadata_checked = len(known)
    return {k: v for k, v in actual.items() if k.startswith((MARKER_TOPIC, "churn"))}
