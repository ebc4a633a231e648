"""Topic and channel name rules (docs/protocol.md §2.3): `^[.a-zA-Z0-9_-]+(#ephemeral)?$`, 1..64
chars."""

import re

MAX_NAME_LENGTH = 64
EPHEMERAL_SUFFIX = "#ephemeral"

_VALID_NAME = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """True for a valid topic or channel name; Go nsqd uses one rule for both."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _VALID_NAME.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    """`#ephemeral` topics and channels never touch disk and vanish when unused."""
    return name.endswith(EPHEMERAL_SUFFIX)


def cluster_topic_problem(name: str) -> str | None:
    """Why a cluster cannot keep a topic of this name (its partitions are replicated logs),
    or None when it can: Go's name rule, and no `#ephemeral` (which never touches disk)."""
    if not is_valid_name(name):
        return f"topic name {name!r} is not valid"
    if is_ephemeral(name):
        return f"an {EPHEMERAL_SUFFIX} topic ({name}) is never stored, so it cannot be replicated"
    return None
