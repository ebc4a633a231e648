"""The client's discovery without I/O (`nsqpy.client.discovery`): a round yields the GETs to
make, takes their answers or errors, and returns what it learnt; the adapters only make the
GETs."""

import outcome
import pytest

from nsqpy.client.discovery import (
    Found,
    LookupdAnswerError,
    LookupdDirectory,
    LookupdGet,
    LookupUnavailable,
    advance,
    read_lookupd_answer,
)

A, B, C = "http://10.0.0.1:4161", "http://10.0.0.2:4161", "http://10.0.0.3:4161"


def partition(host: str, port: int) -> dict:
    return {"broadcast_address": host, "tcp_port": port, "http_port": port + 1}


def lookup_answer(leader: dict) -> dict:
    return {"meta": {"partition_num": 1}, "partitions": {"0": leader}, "producers": [leader]}


def run(round, answers: dict[tuple[str, str], object]) -> tuple[list[LookupdGet], object]:
    """Drive `round` with `answers` by (url, path): a document, or an exception the GET
    raised; the GETs it asked for, in order, and what it returned."""
    asked = []
    step = advance(round, outcome.Value(None))
    while isinstance(step, LookupdGet):
        asked.append(step)
        answer = answers[(step.url, step.path)]
        result = outcome.Error(answer) if isinstance(answer, Exception) else outcome.Value(answer)
        step = advance(round, result)
    assert isinstance(step, Found)
    return asked, step.value


def test_a_first_lookup_learns_the_lookupds_then_asks_each_and_merges():
    directory = LookupdDirectory(["10.0.0.1:4161", B])
    one, other = partition("10.0.1.1", 4150), partition("10.0.1.2", 4150)
    answers = {
        (A, "/listlookup"): {"lookupdnodes": [{"NodeIP": "10.0.0.3", "HttpPort": "4161"}]},
        (B, "/listlookup"): None,
        # The lookupds disagree on partition 0's leader: most of them win.
        (A, "/lookup"): lookup_answer(one),
        (B, "/lookup"): lookup_answer(other),
        (C, "/lookup"): lookup_answer(other),
    }
    asked, layout = run(directory.lookup_round("t", "w"), answers)
    assert [(get.url, get.path) for get in asked] == [
        (A, "/listlookup"),
        (B, "/listlookup"),
        (A, "/lookup"),
        (B, "/lookup"),
        (C, "/lookup"),
    ]
    assert asked[2].params == {"topic": "t", "access": "w", "metainfo": "true"}
    assert layout.partitions == {0: "10.0.1.2:4150"}
    assert layout.http_addresses == {0: "10.0.1.2:4151"}
    assert (directory.lookupds, directory.lookups) == ([A, B, C], 1)
    # The lookupds are not asked again for `/listlookup` until `rediscover_interval`.
    asked, _layout = run(directory.lookup_round("t", "r"), answers)
    assert [get.path for get in asked] == ["/lookup"] * 3


def test_a_lookupd_that_fails_is_asked_last_until_it_answers_again():
    directory = LookupdDirectory([A, B])
    answers: dict = {(A, "/listlookup"): None, (B, "/listlookup"): None}
    answers[(A, "/lookup")] = ConnectionRefusedError("refused")
    answers[(B, "/lookup")] = lookup_answer(partition("10.0.1.1", 4150))
    _asked, layout = run(directory.lookup_round("t"), answers)
    assert layout.answered == (B,)
    # Resting: the next round does not ask A while B answers.
    asked, _layout = run(directory.lookup_round("t"), answers)
    assert [get.url for get in asked] == [B]
    # When every lookupd fails, the resting one is asked too, and the error names them all.
    answers[(B, "/lookup")] = TimeoutError("no answer")
    with pytest.raises(LookupUnavailable) as caught:
        run(directory.lookup_round("t"), answers)
    assert caught.value.failures == {B: "no answer", A: "refused"}


def test_a_lookup_of_the_answers_returns_each_readable_document():
    """What nsq_pubsub needs beyond the merged layout (each answer's producers and `meta`):
    the same round, before the merge; an answer that cannot be read is no answer."""
    directory = LookupdDirectory([A, B, C])
    leader = partition("10.0.1.1", 4150)
    answers: dict = {(url, "/listlookup"): None for url in (A, B, C)}
    answers[(A, "/lookup")] = lookup_answer(leader)
    answers[(B, "/lookup")] = {"partitions": "not an object"}
    answers[(C, "/lookup")] = None  # a lookupd that does not know the topic
    _asked, documents = run(directory.lookup_answers_round("t"), answers)
    assert documents == [(A, lookup_answer(leader)), (C, None)]
    answers[(A, "/lookup")] = ConnectionRefusedError("refused")
    answers[(C, "/lookup")] = TimeoutError("timed out")
    with pytest.raises(LookupUnavailable):
        run(directory.lookup_answers_round("t"), answers)


def test_an_error_a_round_does_not_take_goes_to_its_driver():
    directory = LookupdDirectory([A])
    with pytest.raises(RuntimeError, match="a bug"):
        run(directory.discover_round(), {(A, "/listlookup"): RuntimeError("a bug")})


def test_replicas_of_a_standalone_lookupd_are_none():
    directory = LookupdDirectory([A, B])
    standalone = {(A, "/cluster/stats"): LookupdAnswerError(A, 400)}
    assert run(directory.replicas_round("t"), standalone)[1] == {}
    stats = {"partitions": [{"topic": "t", "partition": 0, "isr_http": ["10.0.1.1:4151"]}]}
    answers = {(A, "/cluster/stats"): OSError("down"), (B, "/cluster/stats"): stats}
    assert run(LookupdDirectory([A, B]).replicas_round("t"), answers)[1] == {0: ["10.0.1.1:4151"]}


def test_an_answer_is_a_document_none_or_an_error():
    assert read_lookupd_answer(A, 200, b'{"producers": []}') == {"producers": []}
    assert read_lookupd_answer(A, 404, b'{"message": "TOPIC_NOT_FOUND"}') is None
    assert read_lookupd_answer(A, 200, b"") is None
    with pytest.raises(LookupdAnswerError, match="HTTP 500 from http://10.0.0.1:4161") as caught:
        read_lookupd_answer(A, 500, b"")
    assert caught.value.code == 500
    with pytest.raises(ValueError):
        read_lookupd_answer(A, 200, b"{not json")
