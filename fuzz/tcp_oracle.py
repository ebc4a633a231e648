"""Which replies nsqd may send to each V2 command: the error texts of docs/protocol.md §2 (official
v1.3.0) and §3 (Youzan), as regular expressions, one table per command.

A fuzz session sends commands and reads what comes back; `Matcher` walks the replies in
order against the commands sent: each reply must be one this command may give, a command
that may stay silent (NOP, RDY, FIN, ...) may be skipped, and after a fatal error nothing
but the close may follow.
"""

import re
from dataclasses import dataclass, field

_NUM = r"-?\d+"
_ANY = r"[\s\S]*"  # names and ids in error texts may hold any byte, newlines included


def _alts(*patterns: str) -> list[re.Pattern]:
    return [re.compile(p, re.DOTALL) for p in patterns]


_IDENTIFY = _alts(
    r"OK",
    r"\{.*\}",  # the feature-negotiation reply
    r"E_INVALID cannot IDENTIFY in current state",
    r"E_BAD_BODY IDENTIFY failed to read body size",
    rf"E_BAD_BODY IDENTIFY body too big {_NUM} > {_NUM}",
    rf"E_BAD_BODY IDENTIFY invalid body size {_NUM}",
    r"E_BAD_BODY IDENTIFY failed to read body",
    r"E_BAD_BODY IDENTIFY failed to decode JSON body",
    rf"E_BAD_BODY IDENTIFY (heartbeat interval|output buffer timeout|output buffer size"
    rf"|sample rate|msg timeout) \({_NUM}\) is invalid",
    r"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
    rf"E_IDENTIFY_FAILED IDENTIFY failed {_ANY}",
)
_AUTH = _alts(
    r"E_INVALID cannot AUTH in current state",
    r"E_INVALID AUTH invalid number of parameters",
    r"E_BAD_BODY AUTH failed to read body size",
    rf"E_BAD_BODY AUTH body too big {_NUM} > {_NUM}",
    rf"E_BAD_BODY AUTH invalid body size {_NUM}",
    r"E_BAD_BODY AUTH failed to read body",
    r"E_INVALID AUTH already set",
    r"E_AUTH_DISABLED AUTH disabled",
)
_SUB = _alts(
    r"OK",
    r"E_INVALID cannot SUB in current state",
    r"E_INVALID cannot SUB with heartbeats disabled",
    r"E_INVALID SUB insufficient number of parameters",
    rf'E_BAD_TOPIC SUB topic name "{_ANY}" is not valid',
    rf'E_BAD_CHANNEL SUB channel name "{_ANY}" is not valid',
    rf"E_SUB_FAILED {_ANY}",
    r"E_TOPIC_NOT_EXIST ",
    rf"E_BAD_PARTITION topic partition is not valid: {_ANY}",
    r"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub",
    r"E_SUB_EXTEND_NEED this topic is extended and should identify as extend support\.",
    r"E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as extend "
    r"support\.",
    r"E_SUB_CHANNEL_NOT_REGISTERED channel is not registered under topic\.",
    r"E_FAILED_ON_NOT_LEADER ",
    r"E_FAILED_ON_NOT_WRITABLE ",
    r"E_INVALID order consume is not allowed while sample rate is not 0",
    rf"E_INVALID invalid consume offset:{_ANY}",
    rf"E_INVALID consume start {_ANY} is not supported yet \(only special:-1\)",
)
_RDY = _alts(
    r"E_INVALID cannot RDY in current state",
    rf"E_INVALID RDY could not parse count {_ANY}",
    rf"E_INVALID RDY count {_NUM} out of range 0-\d+",
)


def _message_command(label: str) -> list[re.Pattern]:
    return _alts(
        rf"E_INVALID cannot {label} in current state",
        rf"E_INVALID {label} insufficient number of params",
        r"E_INVALID invalid message ID",
        r"E_INVALID Invalid Message ID",
        r"E_INVALID No channel",
        rf"E_INVALID REQ could not parse timeout {_ANY}",
        rf"E_{label}_FAILED {label} {_ANY} failed {_ANY}",
        r"E_FAILED_ON_NOT_LEADER ",
        r"E_FAILED_ON_NOT_WRITABLE ",
    )


_YOUZAN_PUBLISH = (
    r"E_TOPIC_NOT_EXIST ",
    rf"E_BAD_PARTITION topic partition is not valid{_ANY}",
    r"E_FAILED_ON_NOT_LEADER ",
    r"E_FAILED_ON_NOT_WRITABLE ",
    rf"E_PUB_TOO_MUCH_WAITING {_ANY}",
)


def _pub(label: str) -> list[re.Pattern]:
    extra = []
    if label == "DPUB":
        extra = [
            rf"E_INVALID DPUB could not parse timeout {_ANY}",
            rf"E_INVALID DPUB timeout {_NUM} out of range 0-\d+",
        ]
    return _alts(
        r"OK",
        rf"E_INVALID {label} insufficient number of parameters",
        rf'E_BAD_TOPIC {label} topic name "{_ANY}" is not valid',
        rf"E_BAD_MESSAGE {label} failed to read message body size",
        rf"E_BAD_MESSAGE {label} invalid message body size {_NUM}",
        rf"E_BAD_MESSAGE {label} message too big {_NUM} > {_NUM}",
        rf"E_BAD_MESSAGE {label} failed to read message body",
        rf"E_{label}_FAILED {label} failed {_ANY}",
        *extra,
        *_YOUZAN_PUBLISH,
    )


_MPUB_BODY = (
    r"E_BAD_BODY MPUB failed to read message count",
    rf"E_BAD_BODY MPUB invalid message count {_NUM}",
    rf"E_BAD_MESSAGE MPUB failed to read message\({_NUM}\) body size",
    rf"E_BAD_MESSAGE MPUB invalid message\({_NUM}\) body size {_NUM}( for tracing)?",
    rf"E_BAD_MESSAGE MPUB message too big {_NUM} > {_NUM}",
    r"E_BAD_MESSAGE MPUB failed to read message body",
    rf"E_BAD_BODY MPUB body size {_NUM} does not match its {_NUM} messages \({_NUM} bytes\)",
)
_MPUB = _alts(
    r"OK",
    r"E_INVALID MPUB insufficient number of parameters",
    rf'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "{_ANY}" is not valid',
    r"E_BAD_BODY MPUB failed to read body size",
    rf"E_BAD_BODY MPUB invalid body size {_NUM}",
    rf"E_BAD_BODY MPUB body too big {_NUM} > {_NUM}",
    *_MPUB_BODY,
    rf"E_MPUB_FAILED MPUB failed {_ANY}",
    *_YOUZAN_PUBLISH,
)
_TRACE_REPLY = re.compile(rb"OK[\s\S]{28}")
_YOUZAN_PUB_COMMON = (
    r"OK",
    r"E_INVALID insufficient number of parameters",
    r"E_BAD_BODY failed to read body size",
    rf"E_BAD_BODY invalid body size {_NUM}",
    rf"E_BAD_MESSAGE message too big {_NUM} > {_NUM}",
    rf"E_BAD_BODY body too big {_NUM} > {_NUM}",
    r"E_BAD_MESSAGE failed to read message body",
    rf"E_BAD_BODY invalid body size {_NUM} with trace id enabled",
    rf"E_BAD_BODY invalid body size {_NUM} with ext json header enabled",
    rf"E_BAD_BODY invalid body size {_NUM} in ext json header content length",
    rf"E_INVALID_JSON_HEADER fail to parse json header:{_ANY}",
    r"INVALID_TRACE_ID passin trace id should be string",
    r"INVALID_TRACE_ID invalid trace id",
    rf"E_EXT_NOT_SUPPORT ext content not supported in topic {_ANY}",
    rf"E_M?PUB_FAILED M?PUB failed {_ANY}",
    *_MPUB_BODY,
    *_YOUZAN_PUBLISH,
)
_YOUZAN_PUB = _alts(*_YOUZAN_PUB_COMMON)
_CREATE = _alts(
    r"OK",
    r"E_INVALID CREATE_TOPIC insufficient number of parameters",
    rf'E_BAD_TOPIC topic name "{_ANY}" is not valid',
    rf"E_BAD_PARTITION topic partition is not valid: {_ANY}",
    r"E_BAD_PARTITION partition should not less than 0",
    rf"E_BAD_EXT topic ext is not valid: {_ANY}",
    rf"E_CREATE_TOPIC_FAILED {_ANY}",
)
_CLS = _alts(r"CLOSE_WAIT", r"E_INVALID cannot CLS in current state")
_UNKNOWN = _alts(rf"E_INVALID invalid command {_ANY}")
# Our own close for a line longer than Go's 16 KiB read buffer (Go closes without a word).
_LINE_TOO_LONG = _alts(r"E_INVALID command line longer than \d+ bytes")
_BAD_MAGIC = _alts(r"E_BAD_PROTOCOL")

ORACLE: dict[str, list[re.Pattern]] = {
    "IDENTIFY": _IDENTIFY,
    "AUTH": _AUTH,
    "SUB": _SUB,
    "SUB_ORDERED": _SUB,
    "SUB_ORDER": _SUB,
    "SUB_ADVANCED": _SUB,
    "RDY": _RDY,
    "FIN": _message_command("FIN"),
    "REQ": _message_command("REQ"),
    "TOUCH": _message_command("TOUCH"),
    "CLS": _CLS,
    "NOP": [],
    "PUB": _pub("PUB"),
    "DPUB": _pub("DPUB"),
    "MPUB": _MPUB,
    "PUB_TRACE": _YOUZAN_PUB,
    "PUB_EXT": _YOUZAN_PUB,
    "MPUB_TRACE": _YOUZAN_PUB,
    "MPUB_EXT": _YOUZAN_PUB,
    "INTERNAL_CREATE_TOPIC": _CREATE,
    "UNKNOWN": _UNKNOWN,
    "MAGIC": _BAD_MAGIC,
}
# Garbage: the server may read it as any command at all, or as a line too long.
ANY_COMMAND = [p for patterns in ORACLE.values() for p in patterns] + _LINE_TOO_LONG

# Commands that may legitimately get no reply at all.
SILENT_OK = {"NOP", "RDY", "FIN", "REQ", "TOUCH"}

# Codes that never close the connection, and those whose fatality depends on the connection
# being in Youzan mode (docs/protocol.md §8 #4); every other code is fatal.
NON_FATAL = {
    "E_FIN_FAILED",
    "E_REQ_FAILED",
    "E_TOUCH_FAILED",
    "E_INVALID_JSON_HEADER",
    "INVALID_TRACE_ID",
    "E_EXT_NOT_SUPPORT",
    "E_CREATE_TOPIC_FAILED",
}
EITHER_FATALITY = {
    "E_PUB_FAILED",
    "E_MPUB_FAILED",
    "E_FAILED_ON_NOT_LEADER",
    "E_FAILED_ON_NOT_WRITABLE",
}


def reply_code(data: bytes) -> str:
    return data.split(b" ", 1)[0].decode("latin-1")


@dataclass(slots=True)
class Expect:
    """What one sent input may get back."""

    oracle: str  # key of ORACLE, or "ANY" for garbage
    silent_ok: bool
    many: bool = False  # garbage may be read as several commands, each answered
    then_any: bool = False  # what follows its first reply is garbage (a prefix too small)


def expectation(name: str, *, garbage: bool = False, truncated: bool = False) -> Expect:
    if garbage:
        return Expect("ANY", True, True)
    key = name if name in ORACLE else "UNKNOWN"
    return Expect(key, truncated or key in SILENT_OK)


def allowed(expect: Expect, frame_type: int, data: bytes) -> bool:
    patterns = ANY_COMMAND if expect.oracle == "ANY" else ORACLE[expect.oracle]
    if frame_type == 0 and expect.oracle in ("PUB_TRACE", "MPUB_TRACE", "PUB_EXT", "ANY"):
        if _TRACE_REPLY.fullmatch(data):
            return True
    if frame_type == 0 and data.startswith(b"E_"):
        return False
    if frame_type == 1 and not (data.startswith(b"E_") or data.startswith(b"INVALID_TRACE_ID")):
        return False
    text = data.decode("utf-8", "surrogateescape")
    return any(p.fullmatch(text) for p in patterns)


@dataclass
class Matcher:
    """Matches the replies of one connection against what was sent, in order."""

    expects: list[Expect] = field(default_factory=list)
    position: int = 0
    fatal_seen: str | None = None
    maybe_fatal_seen: bool = False
    violations: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    replies: int = 0

    def reply(self, frame_type: int, data: bytes) -> None:
        self.replies += 1
        if frame_type == 1:
            code = reply_code(data)
            self.errors[code] = self.errors.get(code, 0) + 1
        if self.fatal_seen is not None:
            self.violations.append(f"reply {data[:120]!r} after fatal {self.fatal_seen[:120]!r}")
            return
        while self.position < len(self.expects):
            expect = self.expects[self.position]
            if allowed(expect, frame_type, data):
                if expect.then_any:
                    self.expects[self.position] = Expect("ANY", True, True)
                elif not expect.many:
                    self.position += 1
                break
            if expect.silent_ok:
                self.position += 1
                continue
            self.violations.append(
                f"reply {data[:160]!r} (type {frame_type}) not allowed for {expect.oracle}"
            )
            return
        else:
            self.violations.append(f"reply {data[:160]!r} with nothing left to answer")
            return
        if frame_type == 1:
            code = reply_code(data)
            if code in EITHER_FATALITY:
                self.maybe_fatal_seen = True
            elif code not in NON_FATAL:
                self.fatal_seen = data.decode("latin-1")

    def closed(self, *, complete: bool) -> None:
        """nsqd closed the connection. `complete`: we sent everything and half-closed, so
        every input that must be answered was answered, unless a fatal error came first."""
        if not complete or self.fatal_seen is not None or self.maybe_fatal_seen:
            return
        for expect in self.expects[self.position :]:
            if not expect.silent_ok:
                self.violations.append(f"no reply to {expect.oracle} before the close")
                return
