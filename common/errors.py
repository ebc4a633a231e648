"""NSQ protocol errors as exceptions that carry the exact wire text (docs/protocol.md §2.11,
§3.9)."""

# Official nsqd keeps the connection open after these three (docs/protocol.md §2.11); every other
# error code closes it.
NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class ProtocolError(Exception):
    """An error a peer caused, sent back as `CODE description`.

    `fatal` errors are sent and then the connection is closed; non-fatal ones leave it open.
    """

    def __init__(
        self, code: str, description: str | None = "", *, fatal: bool | None = None
    ) -> None:
        self.code = code
        self.description = description
        self.fatal = code not in NON_FATAL_CODES if fatal is None else fatal
        super().__init__(self.text)

    @property
    def text(self) -> str:
        # Go formats "%s %s" even when the description is empty, so `E_TOPIC_NOT_EXIST ` keeps its
        # trailing space (docs/protocol.md §1.3); clients match on the prefix. A description of None
        # is for the few raw texts Go sends without that format (`E_BAD_PROTOCOL`).
        if self.description is None:
            return self.code
        return f"{self.code} {self.description}"

    def __repr__(self) -> str:
        return f"ProtocolError({self.text!r}, fatal={self.fatal})"


def refused_write_text(code: str, maybe_stored: bool) -> str:
    """What a publisher hears of a cluster write given up: the code, and whether a follower
    may hold the write anyway (then it may lead next, docs/protocol.md §3.10), over TCP and
    over HTTP alike."""
    if maybe_stored:
        return f"{code} MAYBE_STORED sent to followers before the leader gave up"
    return code


# nsqlookupd's 404 message to `/lookup?access=w` when the topic's partitions have no channel
# yet (Youzan's text; `--allow-write-with-nochannels` lifts the rule).
NO_CHANNEL_FOR_WRITERS = "Topic has no channel, should init at least one for the new topic"
