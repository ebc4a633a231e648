"""A seeded random grammar of V2 sessions: valid commands, valid commands with one field
mutated into something hostile, and garbage, each tagged with what nsqd may answer.

A session is what one connection sends. It mostly follows the protocol (IDENTIFY, SUB, RDY,
publishes, acknowledgements) so that it reaches deep states, and mutates ever more as it
goes. An input that may leave the framing out of step with what we think we sent (a wrong
length prefix, random bytes, an ID with a newline on a Youzan connection, a cut) is always the
last of its session: after it, nsqd may read our bytes as anything, so nothing after it could
be judged.
"""

import json
import random
import struct
from dataclasses import dataclass, field

from fuzz.tcp_oracle import Expect, expectation
from nsqpy.common.command import MAGIC_V2

_SIZE = struct.Struct(">i")
_USIZE = struct.Struct(">I")

MAX_MSG_SIZE = 1024 * 1024
MAX_BODY_SIZE = 5 * 1024 * 1024
MAX_LINE = 16 * 1024 - 1

CANARY_TOPIC = "fuzz_canary"

# Names nsqd accepts: 1..64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral.
# A bounded pool, so that what the fuzzer creates stays bounded (RSS is a checked figure).
VALID_TOPICS = [
    "ft",
    "ft.a-b_c",
    ".",
    "..",
    "ft" + "t" * 61,  # 63 characters
    "ft" + "t" * 62,  # 64
    "fte#ephemeral",
    "fte2#ephemeral",
    "f" * 54 + "#ephemeral",  # 64 with the suffix
    "ftEPH#ephemeral",
]
VALID_CHANNELS = [
    "fc",
    "fc#ephemeral",
    "fd#ephemeral",
    "c" * 64,
    "c" * 54 + "#ephemeral",
    "FC-._#ephemeral",
]
# Names nsqd refuses, as raw bytes (the wire carries bytes, not text).
INVALID_NAMES = [
    b"",
    b"t" * 65,
    b"t" * 55 + b"#ephemeral",  # 65 with the suffix
    b"t" * 1000,
    b"#ephemeral",
    b"t#ephemeral#ephemeral",
    b"t#EPHEMERAL",
    b"t#ephemeralx",
    b"t#ephemera",
    b"t#",
    b"#",
    b"t/x",
    b"t:c",
    b"t*",
    b"t\tx",
    b"t\x00x",
    b"\x00",
    b"t\x7f",
    "tópico".encode(),
    "топик".encode(),
    "主题".encode(),
    "t\u200bx".encode(),  # zero-width space
    "ｔ".encode(),  # fullwidth
    "t٣".encode(),
    "🚀".encode(),
    b"\xff\xfe",
    b"\xc0\xaf",  # overlong '/'
    b"\xed\xa0\x80",  # a UTF-16 surrogate in UTF-8
    b"t%20x",
    b"t\\x",
    b'"t"',
]
INT_TEXTS = [
    b"0",
    b"1",
    b"-1",
    b"100",
    b"2500",
    b"2501",
    b"60000",
    b"3600000",
    b"3600001",
    b"2147483647",
    b"2147483648",
    b"4294967295",
    b"9223372036854775807",
    b"9223372036854775808",
    b"18446744073709551615",
    b"18446744073709551616",
    b"9" * 40,
    b"0" * 30 + b"5",
    b"+5",
    b"-0",
    b"1e3",
    b"0x10",
    b"1_0",
    b"",
    b"\x00",
    b"\xff",
    "٣".encode(),
    "²".encode(),
    "５".encode(),
    b"9" * 5000,
]
SIZE_PREFIXES = [
    0,
    -1,
    1,
    -(2**31),
    2**31 - 1,
    MAX_MSG_SIZE,
    MAX_MSG_SIZE + 1,
    MAX_BODY_SIZE,
    MAX_BODY_SIZE + 1,
    64 * 1024 * 1024,
]
# Length prefixes as unsigned 32-bit values, all the way to 2**32-1.
UNSIGNED_PREFIXES = [2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1, 0xDEADBEEF, 0x80000000]


@dataclass(slots=True)
class Input:
    data: bytes
    expect: Expect
    terminal: bool = False  # framing may be out of step after it


@dataclass
class Session:
    """One connection's worth of inputs, and how it is sent and ended."""

    magic: bytes
    inputs: list[Input] = field(default_factory=list)
    chunking: str = "whole"  # "whole", "cuts" or "bytewise"
    ending: str = "half-close"  # "half-close" or "reset"
    magic_ok: bool = True

    def payload(self) -> bytes:
        return self.magic + b"".join(i.data for i in self.inputs)


def _could_be_valid(name: bytes) -> bool:
    return all(
        c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-#" for c in name
    )


def _line(*parts: bytes) -> bytes:
    return b" ".join(parts) + b"\n"


def _framed(line: bytes, body: bytes) -> bytes:
    return line + _SIZE.pack(len(body)) + body


class Grammar:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    # -- values ------------------------------------------------------------------------

    def topic(self) -> bytes:
        return self.rng.choice(VALID_TOPICS).encode()

    def channel(self) -> bytes:
        return self.rng.choice(VALID_CHANNELS).encode()

    def bad_name(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.7:
            return rng.choice(INVALID_NAMES)
        if roll < 0.85:  # a valid name plus one hostile character
            name = rng.choice(VALID_TOPICS).encode()
            at = rng.randrange(len(name) + 1)
            return name[:at] + rng.choice([b"\x00", b"!", b"\xff", "é".encode(), b"#"]) + name[at:]
        name = bytes(rng.choice(b"abc.-_#\x00\xff\x80 ") for _ in range(rng.randrange(1, 80)))
        # Never a valid name by chance: each would be a new topic, and what the fuzzer
        # creates must stay bounded.
        return name + b"\x00" if _could_be_valid(name) else name

    def int_text(self) -> bytes:
        return self.rng.choice(INT_TEXTS)

    def body(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.6:
            return rng.randbytes(rng.randrange(1, 200))
        if roll < 0.8:
            return rng.choice([b"x", b"\x00" * 16, b"\n", b"\r\n", "ü€😀".encode(), b" " * 10])
        if roll < 0.9999:
            return rng.randbytes(rng.randrange(200, 4000))
        return b"m" * rng.choice([MAX_MSG_SIZE, MAX_MSG_SIZE - 1])  # at the limit: accepted

    def hex_id(self) -> bytes:
        return b"%016x" % self.rng.getrandbits(64)

    # -- IDENTIFY ------------------------------------------------------------------------

    def identify_document(self, heartbeat: int | None = None) -> dict:
        rng = self.rng
        fields = {
            "client_id": lambda: rng.choice(["fuzz", "", "ü" * 300, "\x00", "x" * 5000]),
            "hostname": lambda: rng.choice(["host", "", "h\u2028"]),
            "user_agent": lambda: rng.choice(["fuzz/1.0", "😀"]),
            "feature_negotiation": lambda: rng.random() < 0.5,
            "heartbeat_interval": lambda: rng.choice([-1, 0, 1000, 5000, 30000, 60000]),
            "output_buffer_size": lambda: rng.choice([-1, 0, 64, 16384, 65536]),
            "output_buffer_timeout": lambda: rng.choice([-1, 0, 25, 250, 30000]),
            "tls_v1": lambda: rng.random() < 0.3,  # no TLS configured: never upgrades
            "sample_rate": lambda: rng.choice([0, 1, 50, 99]),
            "msg_timeout": lambda: rng.choice([0, 1000, 60000, 900000]),
            "deflate_level": lambda: rng.choice([0, 1, 6, 9]),
        }
        document = {key: make() for key, make in fields.items() if rng.random() < 0.35}
        if heartbeat is not None:
            document["heartbeat_interval"] = heartbeat
        return document

    def identify_body_hostile(self) -> bytes:
        """IDENTIFY bodies nsqd must refuse (or take) without harm: wrong types, values out
        of range, huge and deep JSON, broken JSON, unicode keys, NUL."""
        rng = self.rng
        kind = rng.randrange(12)
        if kind == 0:
            key = rng.choice(
                [
                    "heartbeat_interval",
                    "output_buffer_size",
                    "output_buffer_timeout",
                    "sample_rate",
                    "msg_timeout",
                ]
            )
            value = rng.choice(
                [-2, 1, 63, 999, 60001, 900001, 100, 2**31, 2**63, -(2**63), 10**30, 1.5]
            )
            return json.dumps({key: value}).encode()
        if kind == 1:  # wrong JSON types
            key = rng.choice(
                ["client_id", "heartbeat_interval", "feature_negotiation", "sample_rate", "tls_v1"]
            )
            value = rng.choice([None, "1", [], {}, True, 1.0, "x" * 100])
            return json.dumps({key: value}).encode()
        if kind == 2:  # deep nesting, under a known or unknown key, or at the top
            depth = rng.choice([100, 999, 1001, 5000, 10001, 100_000, 1_000_000])
            opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
            nested = opener * depth + b"1" + closer * depth
            wrap = rng.randrange(3)
            if wrap == 0:
                return nested
            if wrap == 1:
                return b'{"unknown":' + nested + b"}"
            return b'{"ext_filter":' + nested + b"}"
        if kind == 3:  # huge but flat
            size = rng.choice([100_000, 1_000_000, MAX_BODY_SIZE - 100])
            return json.dumps({"client_id": "x" * size}).encode()
        if kind == 4:  # many keys
            return json.dumps({f"k{n}": n for n in range(rng.choice([1000, 50_000]))}).encode()
        if kind == 5:  # broken JSON
            good = json.dumps(self.identify_document()).encode()
            return good[: rng.randrange(len(good) + 1)] or b"{"
        if kind == 6:
            return rng.choice(
                [b"null", b"[]", b"1", b'"s"', b"true", b"{}", b"{}{}", b"\xef\xbb\xbf{}", b" "]
            )
        if kind == 7:  # unicode, NUL, invalid UTF-8
            return rng.choice(
                [
                    '{"client_id":"\u0000ü😀"}'.encode(),
                    b'{"client_id":"\xff\xfe"}',
                    b'{"\xff":1}',
                    b'{"HEARTBEAT_INTERVAL":-1}',
                    '{"heartbeat_\u0131nterval":1}'.encode(),
                    b'{"client_id":"\\ud800"}',
                    b"\x00",
                ]
            )
        if kind == 8:  # both compressions: refused before any upgrade
            return json.dumps(
                {"feature_negotiation": True, "snappy": True, "deflate": True}
            ).encode()
        if kind == 9:  # duplicate keys, Youzan keys
            return rng.choice(
                [
                    b'{"heartbeat_interval":1000,"heartbeat_interval":"x"}',
                    b'{"desired_tag":"' + b"t" * 200 + b'"}',
                    b'{"extend_support":true}',
                    b'{"ext_filter":null}',
                ]
            )
        if kind == 10:
            return rng.randbytes(rng.randrange(1, 300))
        return json.dumps(self.identify_document()).encode()

    # -- commands --------------------------------------------------------------------

    def valid_command(self, state: dict) -> Input:
        """A command that is well formed for the state we believe the connection is in."""
        rng = self.rng
        subscribed = state["state"] == "subscribed"
        choices = ["PUB", "PUB", "MPUB", "DPUB", "NOP"]
        if state["state"] == "init":
            choices += ["IDENTIFY", "SUB" if state["heartbeat"] else "NOP"]
        if subscribed or state["state"] == "closing":
            choices += ["RDY", "RDY", "FIN", "REQ", "TOUCH", "FIN"]
        if subscribed:
            choices.append("CLS")
        name = rng.choice(choices)
        if name == "PUB":
            return Input(_framed(_line(b"PUB", self.topic()), self.body()), expectation("PUB"))
        if name == "MPUB":
            bodies = [self.body() for _ in range(rng.randrange(1, 20))]
            inner = _SIZE.pack(len(bodies)) + b"".join(_SIZE.pack(len(b)) + b for b in bodies)
            return Input(_framed(_line(b"MPUB", self.topic()), inner), expectation("MPUB"))
        if name == "DPUB":
            line = _line(b"DPUB", self.topic(), b"%d" % rng.choice([0, 1, 500, 3_600_000]))
            return Input(_framed(line, self.body()), expectation("DPUB"))
        if name == "IDENTIFY":
            document = self.identify_document()
            if "heartbeat_interval" in document:
                state["heartbeat"] = document["heartbeat_interval"] != -1
            return Input(
                _framed(b"IDENTIFY\n", json.dumps(document).encode()), expectation("IDENTIFY")
            )
        if name == "SUB":
            state["state"] = "subscribed"
            return Input(_line(b"SUB", self.topic(), self.channel()), expectation("SUB"))
        if name == "RDY":
            return Input(
                _line(b"RDY", b"%d" % rng.choice([0, 1, 10, 100, 2500])), expectation("RDY")
            )
        if name in ("FIN", "TOUCH"):
            return Input(_line(name.encode(), self.hex_id()), expectation(name))
        if name == "REQ":
            timeout = b"%d" % rng.choice([0, 1000, 2**40])
            return Input(_line(b"REQ", self.hex_id(), timeout), expectation("REQ"))
        if name == "CLS":
            state["state"] = "closing"
            return Input(b"CLS\n", expectation("CLS"))
        return Input(b"NOP\n", expectation("NOP"))

    def mutated_command(self, state: dict) -> Input:
        """A command of the V2 set with one hostile field: most are refused, many fatally."""
        rng = self.rng
        kind = rng.randrange(24)
        topic, channel = self.topic(), self.channel()
        if kind == 0:
            line = _line(b"PUB", self.bad_name())
            return Input(_framed(line, self.body()), expectation("PUB"))
        if kind == 1:
            line = _line(b"MPUB", self.bad_name())
            return Input(_framed(line, _SIZE.pack(1) + _SIZE.pack(1) + b"x"), expectation("MPUB"))
        if kind == 2:
            line = _line(b"DPUB", rng.choice([topic, self.bad_name()]), self.int_text())
            return Input(_framed(line, self.body()), expectation("DPUB"))
        if kind == 3:
            args = [rng.choice([topic, self.bad_name()]), rng.choice([channel, self.bad_name()])]
            if rng.random() < 0.3:
                args.append(rng.choice([b"0", b"-1", b"1", b"x", b"99999999999999999999"]))
                state["youzan"] = True
            return Input(_line(b"SUB", *args), expectation("SUB"))
        if kind == 4:
            parts = rng.choice([[], [topic]])
            return Input(_line(b"SUB", *parts), expectation("SUB"))
        if kind == 5:
            return Input(_line(b"RDY", self.int_text()), expectation("RDY"))
        if kind in (6, 7):
            name = rng.choice([b"FIN", b"TOUCH", b"REQ"])
            ident = rng.choice(
                [b"", b"0", self.hex_id()[:15], self.hex_id() + b"0", b"g" * 16, b"\x00" * 16]
            )
            args = [ident] if ident or rng.random() < 0.5 else []
            if name == b"REQ" and rng.random() < 0.7:
                args.append(self.int_text())
            # On a Youzan connection an ID of another length moves the line end (§1.2).
            return Input(_line(name, *args), expectation(name.decode()), terminal=state["youzan"])
        if kind == 8:
            line = _line(b"REQ", self.hex_id(), self.int_text())
            return Input(line, expectation("REQ"))
        if kind == 9:
            body = self.identify_body_hostile()
            return Input(_framed(b"IDENTIFY\n", body), expectation("IDENTIFY"))
        if kind == 10:
            extra = rng.choice([b"", b" x"])
            return Input(_framed(b"AUTH" + extra + b"\n", self.body()), expectation("AUTH"))
        if kind == 11:  # an unknown command: lower case, near misses, unicode, NUL
            name = rng.choice(
                [b"pub", b"PUBB", b"SUB_", b"NOPE", b"V2", b"", b"\x00", "ПУБ".encode(),
                 b"GET", b"IDENTIFY2", b"Pub", b"\xff\xfe", b"FUZZ_" * 10]
            )  # fmt: skip
            return Input(_line(name, topic), expectation("UNKNOWN"))
        if kind == 12:  # every kind of length prefix, to 2**32-1
            name = rng.choice([b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH", b"PUB_TRACE",
                               b"PUB_EXT", b"MPUB_TRACE", b"MPUB_EXT"])  # fmt: skip
            args = {b"PUB": [topic], b"MPUB": [topic], b"DPUB": [topic, b"0"]}.get(name, [])
            if name.startswith((b"PUB_", b"MPUB_")):
                args = [topic]
            if rng.random() < 0.5:
                prefix = _SIZE.pack(rng.choice(SIZE_PREFIXES))
            else:
                prefix = _USIZE.pack(rng.choice(UNSIGNED_PREFIXES))
            tail = rng.randbytes(rng.randrange(0, 64))
            # A small size takes part of the tail as the body; the rest is read as commands.
            expect = expectation(name.decode())
            expect.then_any = True
            return Input(_line(name, *args) + prefix + tail, expect, True)
        if kind == 13:  # a wrong MPUB inner layout
            count = rng.choice([0, -1, 2, 2**31 - 1, 1_048_575, 1_048_576])
            inner = _SIZE.pack(count) + _SIZE.pack(rng.choice([0, -1, 5, MAX_MSG_SIZE + 1])) + b"x"
            inner = inner[: rng.randrange(len(inner) + 1)] or b"\x00"
            return Input(_framed(_line(b"MPUB", topic), inner), expectation("MPUB"))
        if kind == 14:
            return Input(_line(b"DPUB", topic) + _SIZE.pack(1) + b"x", expectation("DPUB"))
        if kind == 15:  # Youzan publishes, valid-looking and not
            state["youzan"] = True
            name = rng.choice([b"PUB_TRACE", b"PUB_EXT", b"MPUB_TRACE", b"MPUB_EXT"])
            args = [topic, *rng.choice([[], [b"0"], [b"-1"], [b"x"], [b"255"]])]
            if name == b"PUB_TRACE":
                body = rng.randbytes(rng.choice([1, 8, 9, 50]))
            elif name == b"PUB_EXT":
                headers = [b"{}", b'{"##trace_id":"12"}', b'{"##trace_id":12}', b"[", b"x",
                           b"\xff", b"[" * 60000, b'{"##trace_id":"\xc2\xb2"}',
                           b'{"##trace_id":"' + b"9" * 30 + b'"}']  # fmt: skip
                header = rng.choice(headers)
                body = struct.pack(">H", len(header) % 65536) + header + b"d"
            else:
                body = _SIZE.pack(1) + _SIZE.pack(10) + rng.randbytes(10)
            return Input(_framed(_line(name, *args), body), expectation(name.decode()))
        if kind == 16:
            state["youzan"] = True
            name = rng.choice([b"SUB_ORDERED", b"SUB_ADVANCED", b"SUB_ORDER"])
            extra = rng.choice(
                [[], [b"0"], [b"-1"], [b"0", b"special:-1"], [b"0", b"timestamp:1"], [b"0", b"x"]]
            )
            args = [topic, channel, *extra]
            return Input(_line(name, *args), expectation(name.decode()))
        if kind == 17:
            name = b"INTERNAL_CREATE_TOPIC"
            args = rng.choice(
                [[], [topic], [topic, b"0"], [topic, b"1", b"true"], [topic, b"-1"],
                 [self.bad_name(), b"0"], [topic, b"x"], [topic, b"0", b"maybe"]]
            )  # fmt: skip
            return Input(_line(name, *args), expectation(name.decode()))
        if kind == 18:  # spaces: empty parameters, trailing '\r'
            line = rng.choice(
                [b"PUB  " + topic, b"PUB " + topic + b" ", b"SUB " + topic + b"  " + channel,
                 b"RDY  1", b"NOP ", b" NOP", b"PUB " + topic + b"\r"]
            )  # fmt: skip
            name = line.split(b" ")[0].strip() or b""
            if line.startswith(b"PUB"):
                return Input(_framed(line + b"\n", b"x"), expectation("PUB"))
            return Input(line + b"\n", expectation(name.decode() if name else "UNKNOWN"))
        if kind == 19:
            return Input(b"CLS\n", expectation("CLS"))
        if kind == 20:  # a line at and past the 16 KiB limit
            length = rng.choice([MAX_LINE - 5, MAX_LINE + 10, 100_000])
            line = b"PUB " + b"t" * length + b"\n"
            return Input(_framed(line, b"x"), expectation("PUB", garbage=True), True)
        if kind == 21:  # a second IDENTIFY after SUB, AUTH after SUB
            return Input(_framed(b"IDENTIFY\n", b"{}"), expectation("IDENTIFY"))
        if kind == 22:  # a message body of every awkward size
            size = rng.choice([MAX_MSG_SIZE + 1, 0])
            line = _line(b"PUB", topic) + _SIZE.pack(size)
            return Input(line, expectation("PUB"), True)
        # garbage
        return Input(self.garbage(), expectation("", garbage=True), True)

    def garbage(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.4:
            return rng.randbytes(rng.randrange(1, 600))
        pieces = [b"PUB ", b"MPUB ", b"SUB ", b"FIN ", b"IDENTIFY\n", b"\n", b"\r\n", b" ",
                  b"\x00", MAGIC_V2, b"#ephemeral", self.topic(),
                  _SIZE.pack(rng.randrange(-5, 99))]  # fmt: skip
        return b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40)))

    # -- sessions --------------------------------------------------------------------

    def session(self) -> Session:
        rng = self.rng
        roll = rng.random()
        if roll < 0.015:
            magic = rng.choice([b"  V1", b"V2  ", b"  v2", b"\x00\x00\x00\x00", b"GET ",
                                b"\xff\xff\xff\xff", b" V2\n", "  V²".encode()[:4]])  # fmt: skip
            session = Session(magic + rng.randbytes(rng.randrange(0, 50)), magic_ok=False)
            session.inputs.append(Input(b"", expectation("MAGIC")))
            return session
        if roll < 0.02:  # the magic cut short, then EOF
            session = Session(MAGIC_V2[: rng.randrange(0, 4)], magic_ok=False)
            session.inputs.append(Input(b"", Expect("MAGIC", True)))
            return session
        session = Session(MAGIC_V2)
        state = {"state": "init", "heartbeat": True, "youzan": False}
        if rng.random() < 0.5:
            document = self.identify_document(heartbeat=rng.choice([None, 1000, 30000]))
            state["heartbeat"] = document.get("heartbeat_interval", 0) != -1
            body = json.dumps(document).encode()
            session.inputs.append(Input(_framed(b"IDENTIFY\n", body), expectation("IDENTIFY")))
        if rng.random() < 0.6 and state["heartbeat"]:
            topic = self.topic()
            session.inputs.append(Input(_line(b"SUB", topic, self.channel()), expectation("SUB")))
            state["state"] = "subscribed"
            rdy = b"%d" % rng.choice([1, 10, 100])
            session.inputs.append(Input(_line(b"RDY", rdy), expectation("RDY")))
        mutation_rate = rng.choice([0.02, 0.05, 0.1, 0.3])
        for _ in range(rng.randrange(1, 60)):
            if rng.random() < mutation_rate:
                item = self.mutated_command(state)
            else:
                item = self.valid_command(state)
            session.inputs.append(item)
            if item.terminal:
                break
        if rng.random() < 0.08:  # cut the last input short: nsqd sees EOF mid-command
            last = session.inputs[-1]
            if len(last.data) > 1:
                cut = rng.randrange(1, len(last.data))
                session.inputs[-1] = Input(
                    last.data[:cut], Expect(last.expect.oracle, True, last.expect.many), True
                )
        size = len(session.payload())
        chunk_roll = rng.random()
        if chunk_roll < 0.03 and size < 400:
            session.chunking = "bytewise"
        elif chunk_roll < 0.3:
            session.chunking = "cuts"
        if rng.random() < 0.04:
            session.ending = "reset"
        return session


def chunks(rng: random.Random, payload: bytes, chunking: str) -> list[bytes]:
    if chunking == "whole" or not payload:
        return [payload]
    if chunking == "bytewise":
        return [payload[i : i + 1] for i in range(len(payload))]
    cuts = sorted(rng.sample(range(1, len(payload)), min(len(payload) - 1, rng.randrange(1, 12))))
    edges = [0, *cuts, len(payload)]
    return [payload[a:b] for a, b in zip(edges, edges[1:], strict=False)]
