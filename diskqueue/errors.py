"""Errors a caller of the diskqueue can cause."""


class MessageSizeError(ValueError):
    """A record is shorter than min_msg_size or longer than max_msg_size.

    The text is go-diskqueue's writeOne error, so nsqd can log or relay it unchanged.
    """

    def __init__(self, size: int, min_msg_size: int, max_msg_size: int) -> None:
        super().__init__(
            f"invalid message write size ({size}) "
            f"minMsgSize={min_msg_size} maxMsgSize={max_msg_size}"
        )
        self.size = size
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size


class QueueClosedError(RuntimeError):
    """The queue was closed or deleted; go-diskqueue answers Put with "exiting" then."""

    def __init__(self, name: str) -> None:
        super().__init__(f"DISKQUEUE({name}) exiting")
        self.name = name
