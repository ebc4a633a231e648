"""Topic and channel names (docs/protocol.md §2.3): `^[.a-zA-Z0-9_-]+(#ephemeral)?$`, 1..64
chars."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqpy.common.names import (
    EPHEMERAL_SUFFIX,
    MAX_NAME_LENGTH,
    is_ephemeral,
    is_valid_channel_name,
    is_valid_name,
    is_valid_topic_name,
)

VALID = [
    "a",
    "A",
    "0",
    ".",
    "-",
    "_",
    "test_topic",
    "Topic-1.v2",
    "a" * 64,
    "t#ephemeral",
    "a" * 54 + "#ephemeral",  # 64 with the suffix
    "..",
    "_-.",
]

INVALID = [
    "",
    "a" * 65,
    "a" * 55 + "#ephemeral",  # 65 with the suffix
    "#ephemeral",
    "t#ephemeral#ephemeral",
    "t#Ephemeral",
    "t#eph",
    "t#",
    "#",
    "a b",
    " a",
    "a ",
    "a\n",  # Go's `$` does not match before a trailing newline; Python's would
    "\na",
    "a\r",
    "a\t",
    "a\x00",
    "a/b",
    "a:b",
    "a*",
    "a@b",
    'a"b',
    "a,b",
    "é",
    "tópico",
    "ａ",  # fullwidth a
    "٣",  # Arabic-Indic digit three
    "ǅ",
    "\u212a",  # Kelvin sign, which case-folds to "k"
    "t\u200b",
    "😀",
]


@pytest.mark.parametrize("name", VALID)
def test_valid_names(name: str) -> None:
    assert is_valid_name(name)
    assert is_valid_topic_name(name)
    assert is_valid_channel_name(name)


@pytest.mark.parametrize("name", INVALID)
def test_invalid_names(name: str) -> None:
    assert not is_valid_name(name)
    assert not is_valid_topic_name(name)
    assert not is_valid_channel_name(name)


def test_constants() -> None:
    assert MAX_NAME_LENGTH == 64
    assert EPHEMERAL_SUFFIX == "#ephemeral"


def test_invalid_utf8_from_the_wire_is_invalid() -> None:
    # The parser hands names over as go_text(raw): undecodable bytes become surrogates.
    assert not is_valid_name(b"t\xff".decode("utf-8", "surrogateescape"))


@pytest.mark.parametrize(
    ("name", "ephemeral"),
    [
        ("t#ephemeral", True),
        ("a" * 54 + "#ephemeral", True),
        ("t", False),
        ("ephemeral", False),
        ("t#ephemeral.x", False),
        ("t-ephemeral", False),
    ],
)
def test_is_ephemeral(name: str, ephemeral: bool) -> None:
    assert is_ephemeral(name) is ephemeral


GO_RULE = re.compile(r"\A[.a-zA-Z0-9_-]+(#ephemeral)?\Z")


@given(st.text(alphabet=st.sampled_from("ab.-_Z9 #ephemrl\n\xe9"), max_size=80))
def test_matches_the_go_rule(name: str) -> None:
    # Go: len(name) in 1..64 bytes and the regexp; every valid name is ASCII, so bytes == chars.
    expected = 1 <= len(name.encode()) <= 64 and GO_RULE.match(name) is not None
    assert is_valid_name(name) is expected
