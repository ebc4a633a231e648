"""Youzan's `ext_filter` (IDENTIFY, docs/protocol.md §3.5): a consumer of an ext topic receives
only the messages whose JSON header matches its filter; the others are finished for the
channel without being sent (Youzan's `ConfirmMsgWithoutGoInflight`).

    {"type": 1, "filter_ext_key": "k", "filter_data": "v"}        the value equals `v`
    {"type": 2, "filter_ext_key": "k", "filter_data": "^v\\d+$"}   a regular expression finds it
    {"type": 3, "filter_ext_key": "k", "filter_data": "v*"}        a glob matches the value
    {"type": 4, "filter_ext_key": "any"|"all",
     "filter_data_list": [{"filter_ext_key": "k", "filter_data": "v"}, ...]}
                                                                   any or all of these equal
    "inverse": true                                                the messages that do not match

A key is looked up at the header's top level and only a string value counts (a message
without a header, or whose value is not a string, matches no rule but an empty one).
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

EXACT, REGEXP, GLOB, MULTI = 1, 2, 3, 4


# How many headers a filter remembers its verdict on (a producer's headers repeat: a tag,
# a region); past that it forgets them all and starts again.
REMEMBERED_HEADERS = 1024


@dataclass(frozen=True)
class ExtFilter:
    match: Callable[[dict], bool]
    inverse: bool
    _verdicts: dict[bytes, bool] = field(default_factory=dict, compare=False, repr=False)

    def accepts(self, header: bytes) -> bool:
        """Whether a message with this JSON header goes to the consumer."""
        verdicts = self._verdicts
        verdict = verdicts.get(header)
        if verdict is None:
            try:
                fields = json.loads(header) if header else None
            except ValueError:
                fields = None
            verdict = (isinstance(fields, dict) and self.match(fields)) != self.inverse
            if len(verdicts) >= REMEMBERED_HEADERS:
                verdicts.clear()
            verdicts[header] = verdict
        return verdict


def parse_ext_filter(data: object) -> ExtFilter | None:
    """The filter an IDENTIFY names (None when it names none: absent, `null` or type 0);
    ValueError with Youzan's reason for one it cannot use."""
    if not isinstance(data, dict) or not data.get("type"):
        return None
    kind = data["type"]
    key = data.get("filter_ext_key") or ""
    pattern = data.get("filter_data") or ""
    if not isinstance(key, str) or not isinstance(pattern, str) or not key:
        raise ValueError("invalid filter rule")
    if not pattern and kind != MULTI:
        raise ValueError("invalid filter rule")
    if kind == EXACT:
        match = _equals(key, pattern)
    elif kind == REGEXP:
        search = _compiled(pattern).search
        match = lambda fields: search(_text(fields, key)) is not None  # noqa: E731
    elif kind == GLOB:
        fullmatch = _compiled(glob_to_regex(pattern)).fullmatch
        match = lambda fields: fullmatch(_text(fields, key)) is not None  # noqa: E731
    elif kind == MULTI:
        match = _multi(key, data.get("filter_data_list"))
    else:
        raise ValueError("the filter type not supported")
    return ExtFilter(match, data.get("inverse") is True)


def _text(fields: dict, key: str) -> str:
    value = fields.get(key)
    return value if isinstance(value, str) else ""


def _equals(key: str, expected: str) -> Callable[[dict], bool]:
    return lambda fields: fields.get(key) == expected


def _multi(relation: str, rules: object) -> Callable[[dict], bool]:
    if not isinstance(rules, list) or not rules:
        raise ValueError("invalid filter rule")
    checks = []
    for rule in rules:
        key = rule.get("filter_ext_key") if isinstance(rule, dict) else None
        expected = rule.get("filter_data") if isinstance(rule, dict) else None
        if not (isinstance(key, str) and key and isinstance(expected, str) and expected):
            raise ValueError("invalid filter rule")
        checks.append(_equals(key, expected))
    if relation == "any":
        return lambda fields: any(check(fields) for check in checks)
    if relation == "all":
        return lambda fields: all(check(fields) for check in checks)
    # Youzan's chain matches nothing under another relation.
    return lambda fields: False


def _compiled(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(f"error parsing regexp: {error}") from None


def glob_to_regex(pattern: str) -> str:
    """A glob as Youzan's (gobwas/glob without separators) as a regular expression: `*` any
    text, `?` one character, `[abc]`, `[a-z]`, `[!abc]`, `{a,b}` alternatives, `\\` escapes."""
    out: list[str] = []
    depth = 0
    at = 0
    while at < len(pattern):
        char = pattern[at]
        if char == "\\" and at + 1 < len(pattern):
            out.append(re.escape(pattern[at + 1]))
            at += 2
            continue
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = pattern.find("]", at + 2)
            if end < 0:
                raise ValueError("invalid filter rule")
            body = pattern[at + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            at = end
        elif char == "{":
            depth += 1
            out.append("(?:")
        elif char == "}" and depth:
            depth -= 1
            out.append(")")
        elif char == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(char))
        at += 1
    if depth:
        raise ValueError("invalid filter rule")
    return "".join(out)
