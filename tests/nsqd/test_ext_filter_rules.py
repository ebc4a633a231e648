"""The rules of Youzan's `ext_filter` (nsqd/ext_filter.py) on their own: exact, regular
expression, glob and multi, inverse, and the rules Youzan's nsqd cannot use."""

import pytest

from nsqpy.nsqd.ext_filter import REMEMBERED_HEADERS, parse_ext_filter


def multi(relation: str) -> dict:
    """A type 4 rule: k equals x, j equals y, under `relation` (`any` or `all`)."""
    return {
        "type": 4,
        "filter_ext_key": relation,
        "filter_data_list": [
            {"filter_ext_key": "k", "filter_data": "x"},
            {"filter_ext_key": "j", "filter_data": "y"},
        ],
    }


@pytest.mark.parametrize(
    "rule, header, accepted",
    [
        ({"type": 1, "filter_ext_key": "k", "filter_data": "a"}, b'{"k":"a"}', True),
        ({"type": 1, "filter_ext_key": "k", "filter_data": "a"}, b'{"k":"ab"}', False),
        ({"type": 1, "filter_ext_key": "k", "filter_data": "a"}, b"", False),
        ({"type": 1, "filter_ext_key": "k", "filter_data": "1"}, b'{"k":1}', False),
        ({"type": 2, "filter_ext_key": "k", "filter_data": "^a[0-9]+"}, b'{"k":"a12x"}', True),
        ({"type": 2, "filter_ext_key": "k", "filter_data": "b"}, b'{"k":"abc"}', True),
        ({"type": 2, "filter_ext_key": "k", "filter_data": "^b"}, b'{"k":"abc"}', False),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "a*"}, b'{"k":"abc"}', True),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "a?c"}, b'{"k":"abc"}', True),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "{x,a}b[!d]"}, b'{"k":"abc"}', True),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "a"}, b'{"k":"abc"}', False),
        (multi("any"), b'{"k":"a","j":"y"}', True),
        (multi("all"), b'{"k":"a","j":"y"}', False),
        ({"type": 1, "filter_ext_key": "k", "filter_data": "a", "inverse": True}, b"", True),
    ],
)
def test_each_kind_of_rule(rule, header, accepted):
    assert parse_ext_filter(rule).accepts(header) is accepted


@pytest.mark.parametrize(
    "rule",
    [
        {"type": 1, "filter_ext_key": "", "filter_data": "a"},
        {"type": 2, "filter_ext_key": "k", "filter_data": "("},
        {"type": 4, "filter_ext_key": "any", "filter_data_list": []},
        {"type": 9, "filter_ext_key": "k", "filter_data": "a"},
    ],
)
def test_a_rule_youzan_cannot_use_is_refused(rule):
    with pytest.raises(ValueError):
        parse_ext_filter(rule)


def test_a_filter_gives_the_same_verdict_on_a_header_it_remembers_and_past_its_memory():
    """Verdicts are remembered by header (a producer's headers repeat); past
    REMEMBERED_HEADERS distinct ones it forgets and decides again, the same."""
    rule = parse_ext_filter(
        {"type": 3, "filter_ext_key": "k", "filter_data": "*7", "inverse": True}
    )
    headers = [b'{"k":"%d"}' % n for n in range(REMEMBERED_HEADERS * 2 + 3)]
    first = [rule.accepts(header) for header in headers]
    assert first == [not header.endswith(b'7"}') for header in headers]
    assert [rule.accepts(header) for header in reversed(headers)] == first[::-1]
