"""Fuzzing the V2 protocol (issue #10): a short seeded run in the default suite, the long run
behind `slow`, and a regression test for each bug the fuzzing found.

The fuzz code is fuzz/ (grammar, oracle, runner); `python -m fuzz.run` is the long campaign.
"""

import json
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz import codec_target
from fuzz.canary import Canary
from fuzz.daemon import RSSSampler
from fuzz.run import run_campaign
from fuzz.tcp_fuzz import TCPFuzzer, TCPStats, slowloris_session
from fuzz.tcp_grammar import Grammar
from fuzz.tcp_oracle import Matcher, expectation
from nsqpy.common.command import MAGIC_V2
from nsqpy.common.frame import FRAME_TYPE_ERROR, FrameDecoder
from nsqpy.common.goformat import go_quote
from tests.reliability.fuzz_fixtures import fuzz_nsqd, shared_fuzz_nsqd  # noqa: F401

SEED = 0x10F022
SHORT_INPUTS = 20_000
ROOT = Path(__file__).resolve().parents[2]


def _exchange(port: int, payload: bytes, timeout: float = 20.0) -> list[tuple[int, bytes]]:
    """Send `payload` after the magic, half-close, and return every frame until nsqd closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(MAGIC_V2 + payload)
        sock.shutdown(socket.SHUT_WR)
        decoder = FrameDecoder()
        frames = []
        while data := sock.recv(65536):
            frames.extend((f.frame_type, f.data) for f in decoder.receive_data(data))
    return frames


# -- the oracle itself -------------------------------------------------------------------------


def test_the_oracle_refuses_what_nsqd_must_never_say() -> None:
    # A reply of the wrong command, a reply after a fatal error, a missing reply: each caught.
    matcher = Matcher([expectation("PUB"), expectation("NOP"), expectation("SUB")])
    matcher.reply(FRAME_TYPE_ERROR, b'E_BAD_TOPIC SUB topic name "x" is not valid')
    assert matcher.violations
    matcher = Matcher([expectation("PUB"), expectation("PUB")])
    matcher.reply(FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB invalid message body size 0")
    matcher.reply(0, b"OK")
    assert matcher.violations
    matcher = Matcher([expectation("NOP"), expectation("IDENTIFY")])
    matcher.closed(complete=True)
    assert matcher.violations
    # ... and lets through what nsqd may say.
    matcher = Matcher(
        [expectation("NOP"), expectation("RDY"), expectation("FIN"), expectation("PUB")]
    )
    matcher.reply(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")
    matcher.reply(0, b"OK")
    matcher.closed(complete=True)
    assert not matcher.violations


# -- the short seeded runs -----------------------------------------------------------------


def test_codec_survives_seeded_random_and_mutated_input() -> None:
    assert codec_target.run_random(2000, SEED) == 2000


def test_codec_atheris_target_runs(tmp_path) -> None:
    """The atheris target itself, coverage-guided, for a bounded number of runs."""
    import atheris  # noqa: F401 - the `test` extra installs it (pyproject.toml)

    result = subprocess.run(
        [sys.executable, "-m", "fuzz.codec_target", "-atheris_runs=2000", f"-seed={SEED}",
         str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done 2000 in" in result.stderr, result.stderr[-3000:]


def test_seeded_protocol_fuzz_keeps_nsqd_correct_and_the_canary_alive(nsqd) -> None:
    """20,000 grammar inputs over 8 concurrent connections: every reply allowed for its
    command, fatal errors followed by the close, no internal error, RSS bounded, and a
    canary producer and consumer losing nothing beside them."""
    port = nsqd.port("TCP")
    rss = RSSSampler(nsqd.pid).start()
    canary = Canary(port).start()
    stats = TCPFuzzer(port, SEED, SHORT_INPUTS, workers=8).run()
    problems = canary.finish()
    rss.stop()
    assert stats.violations == [], stats.violations[:5]
    assert problems == []
    assert stats.inputs_parsed >= SHORT_INPUTS
    assert nsqd.alive()
    assert nsqd.internal_error_count == 0, nsqd.internal_errors
    # The run reached deep: replies of many kinds, the fatal and the non-fatal.
    assert {"E_FIN_FAILED", "E_INVALID", "E_BAD_TOPIC", "E_BAD_BODY", "E_BAD_MESSAGE",
            "E_BAD_PROTOCOL"} <= set(stats.errors_by_code)  # fmt: skip
    assert stats.messages_received > 0
    assert rss.peak < 1024 * 1024, f"RSS peaked at {rss.peak} KiB"
    assert nsqd.stop() == 0


def test_tcp_slowloris_is_cut_off_by_the_read_deadline(shared_nsqd) -> None:
    """A command dribbled a byte every 0.2 s never completes: nsqd's read deadline (2 x the
    1 s heartbeat) runs from the start of the command, as Go's does, not from the last byte
    (the bug the fuzzing found: each byte used to restart the deadline, so a slowloris held
    its connection for ever)."""
    stats = TCPStats()
    threads = [
        threading.Thread(target=slowloris_session, args=(shared_nsqd.port("TCP"), stats, gap))
        for gap in (0.1, 0.3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.violations == []
    assert stats.slowloris_cut == 2


def test_a_busy_client_is_not_cut_off_by_the_per_command_deadline(shared_nsqd) -> None:
    """The other side of the slowloris fix: a client whose commands keep completing keeps its
    connection however long it lasts, even when every read ends mid-command."""
    port = shared_nsqd.port("TCP")
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        body = b'{"heartbeat_interval":1000}'
        sock.sendall(MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        pub = b"PUB fuzz_busy\n" + struct.pack(">i", 3) + b"abc"
        stream = pub * 40
        # 40 PUBs paced over ~2.5 s (past the 2 s deadline), most sends ending mid-command.
        for start in range(0, len(stream), 5):
            sock.sendall(stream[start : start + 5])
            time.sleep(0.015)
        sock.shutdown(socket.SHUT_WR)
        decoder = FrameDecoder()
        frames = []
        while data := sock.recv(65536):
            frames.extend(decoder.receive_data(data))
    replies = [f.data for f in frames if f.data != b"_heartbeat_"]
    assert replies[1:] == [b"OK"] * 40


# -- regressions found by the fuzzing --------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b'{"ext_filter":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    ],
    ids=["deep-array", "deep-object", "deep-under-a-youzan-key"],
)
def test_deeply_nested_identify_json_is_refused_with_e_bad_body(shared_nsqd, body) -> None:
    """Deep JSON used to raise RecursionError inside IDENTIFY: the connection was dropped
    without a word and nsqd logged an internal error. Go's decoder refuses nesting past
    10,000 with an error, so nsqd answers E_BAD_BODY."""
    frames = _exchange(shared_nsqd.port("TCP"), b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    assert frames == [(FRAME_TYPE_ERROR, b"E_BAD_BODY IDENTIFY failed to decode JSON body")]
    assert shared_nsqd.internal_error_count == 0, shared_nsqd.internal_errors


def test_identify_with_a_body_at_max_body_size_is_answered(shared_nsqd) -> None:
    body = json.dumps({"client_id": "x" * (5 * 1024 * 1024 - 20)}).encode()
    assert len(body) <= 5 * 1024 * 1024
    frames = _exchange(shared_nsqd.port("TCP"), b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    assert frames == [(0, b"OK")]


@pytest.mark.parametrize("prefix", [2**31, 2**31 + 7, 2**32 - 2, 2**32 - 1])
def test_length_prefixes_up_to_2_32_minus_1_are_refused_before_any_body(
    shared_nsqd, prefix
) -> None:
    signed = prefix - 2**32
    frames = _exchange(shared_nsqd.port("TCP"), b"PUB t\n" + struct.pack(">I", prefix))
    assert frames == [
        (FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB invalid message body size %d" % signed)
    ]


def test_names_at_and_over_64_characters(shared_nsqd) -> None:
    port = shared_nsqd.port("TCP")
    for name, ok in [
        (b"n" * 63, True),
        (b"n" * 64, True),
        (b"n" * 65, False),
        (b"n" * 54 + b"#ephemeral", True),
        (b"n" * 55 + b"#ephemeral", False),
        (b"#ephemeral", False),
        (b"n#ephemeral#ephemeral", False),
        (b"n#EPHEMERAL", False),
        (b"n\x00", False),
        ("nü".encode(), False),
        (b"\xff\xfe", False),
    ]:
        frames = _exchange(port, b"PUB " + name + b"\n" + struct.pack(">i", 1) + b"x")
        if ok:
            assert frames == [(0, b"OK")], name
        else:
            text = f"E_BAD_TOPIC PUB topic name {go_quote(name)} is not valid"
            assert frames == [(FRAME_TYPE_ERROR, text.encode())], name


# -- the long run ----------------------------------------------------------------------------


@pytest.mark.slow
def test_long_protocol_and_http_fuzz_campaign(tmp_path) -> None:
    """What `python -m fuzz.run --protocol-inputs 1000000 --http-requests 100000` runs."""
    report = run_campaign(
        protocol_inputs=1_000_000,
        http_requests=100_000,
        seed=random.Random(SEED).randrange(2**31),
        data_path=tmp_path,
    )
    assert report["failures"] == [], report["failures"][:10]


def test_grammar_is_deterministic_for_a_seed() -> None:
    def sessions(seed: int) -> list[bytes]:
        grammar = Grammar(random.Random(seed))
        return [grammar.session().payload() for _ in range(20)]

    assert sessions(5) == sessions(5)
    assert sessions(5) != sessions(6)


# -- hypothesis-driven sessions ----------------------------------------------------------------

_COMMAND_NAMES = ["PUB", "DPUB", "MPUB", "SUB", "RDY", "FIN", "REQ", "TOUCH", "CLS", "NOP",
                  "IDENTIFY", "AUTH", "PUB_TRACE", "SUB_ORDERED", "pub", "NOPE"]  # fmt: skip
_BODY_COMMANDS = {"PUB", "DPUB", "MPUB", "IDENTIFY", "AUTH", "PUB_TRACE"}
_words = st.one_of(
    st.sampled_from(
        [
            b"t",
            b"c",
            b"t#ephemeral",
            b"0",
            b"1",
            b"-1",
            b"2500",
            b"a" * 64,
            b"a" * 65,
            b"0123456789abcdef",
        ]
    ),  # fmt: skip
    st.binary(max_size=70).filter(lambda word: b" " not in word and b"\n" not in word),
)


@st.composite
def _commands(draw) -> tuple[bytes, list]:
    """A session: commands with drawn names, arguments and bodies, each well framed (a body
    command's size prefix matches its body), and what each may get back."""
    payload, expects = b"", []
    for _ in range(draw(st.integers(1, 8))):
        name = draw(st.sampled_from(_COMMAND_NAMES))
        args = draw(st.lists(_words, max_size=3))
        line = b" ".join([name.encode(), *args]) + b"\n"
        if name in _BODY_COMMANDS:
            body = draw(st.one_of(st.binary(max_size=64), st.just(b'{"client_id":"x"}')))
            line += struct.pack(">I", len(body)) + body
        payload += line
        expects.append(expectation(name))
    return payload, expects


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(session=_commands())
def test_hypothesis_sessions_get_only_allowed_replies(shared_nsqd, session) -> None:
    """Sessions hypothesis draws (and shrinks, when one fails) get, command by command, only
    replies docs/protocol.md allows for that command, and a fatal error is the last thing said."""
    payload, expects = session
    matcher = Matcher(list(expects))
    for frame_type, data in _exchange(shared_nsqd.port("TCP"), payload):
        matcher.reply(frame_type, data)
    matcher.closed(complete=True)
    assert matcher.violations == [], (payload[:300], matcher.violations)
    assert shared_nsqd.alive()
