"""The journal of nsqd.dat (nsqd/metadata_journal.py, nsqd/topology_store.py): a topic or
channel made, changed or deleted costs one line, written before the answer, so every answered
change survives a kill -9 at once, with one nsqd or `--workers`; nsqd.dat takes them in the
background and the journals go."""

import logging
import os
import signal

import pytest

from nsqpy.nsqd.metadata import (
    ChannelMetadata,
    TopicMetadata,
    encode_metadata,
    read_metadata,
    write_metadata,
)
from nsqpy.nsqd.metadata_journal import MetadataJournal, apply_journals, journal_files
from nsqpy.nsqd.worker import owner_of
from tests.harness import start_nsqd
from tests.support.http import get_json, post
from tests.support.polling import poll
from tests.support.workers import WORKERS, topics_on_both, worker_pids

LOG = logging.getLogger("test")


def _names(topics: list[TopicMetadata]) -> dict[tuple[str, int | None], list[str]]:
    return {(t.name, t.partition): [c.name for c in t.channels] for t in topics}


# -- the journal itself ------------------------------------------------------------------------


def test_lines_apply_in_order_over_nsqd_dat_and_across_generations(tmp_path):
    data = str(tmp_path)
    write_metadata(data, encode_metadata([TopicMetadata("old"), TopicMetadata("gone")], "1"))
    first = MetadataJournal(data, 0, owns_every_file=True)
    first.put(TopicMetadata("t", channels=[ChannelMetadata("c")]))
    first.delete("gone", None)
    first.rotate()
    first.put(
        TopicMetadata("t", paused=True, channels=[ChannelMetadata("c"), ChannelMetadata("d")])
    )
    first.delete("old", None)
    first.put(TopicMetadata("old"))
    first.close()
    # A later run: its lines come after every earlier journal's.
    later = MetadataJournal(data, 1, owns_every_file=True)
    later.delete("t", None)
    later.put(TopicMetadata("p", partition=3, next_offset=10))
    later.close()
    topics = apply_journals(read_metadata(data), data, LOG)
    assert _names(topics) == {("old", None): [], ("p", 3): []}
    assert len(journal_files(data)) == 3


def test_a_line_written_before_a_later_nsqd_dat_never_takes_a_log_offset_back(tmp_path):
    data = str(tmp_path)
    journal = MetadataJournal(data, 0, owns_every_file=True)
    journal.put(TopicMetadata("p", partition=0, next_offset=100))
    journal.close()
    # nsqd.dat was written after that line (the journal not yet removed) with a later offset.
    write_metadata(data, encode_metadata([TopicMetadata("p", partition=0, next_offset=500)], "1"))
    (topic,) = apply_journals(read_metadata(data), data, LOG)
    assert topic.next_offset == 500


def test_a_torn_line_is_skipped_with_a_warning_and_the_rest_applies(tmp_path, caplog):
    data = str(tmp_path)
    journal = MetadataJournal(data, 0, owns_every_file=True)
    journal.put(TopicMetadata("a"))
    path = journal.path
    journal.close()
    with open(path, "ab") as file:
        file.write(b'{"put":{"name":"tor\n{"delete":{"name":"a","partition":null}}\n')
        file.write(b'{"put":{"name":"b","paused":false,"channels":[]}}\n')
    with caplog.at_level(logging.WARNING):
        topics = apply_journals([], data, LOG)
    assert _names(topics) == {("b", None): []}
    assert [r.message for r in caplog.records if "skipping line 2" in r.message]


def test_a_worker_applies_only_the_lines_of_its_own_topics(tmp_path):
    data = str(tmp_path)
    names = topics_on_both(4)
    journal = MetadataJournal(data, 0, owns_every_file=False)
    for name in names:
        journal.put(TopicMetadata(name))
    journal.close()
    for index in range(WORKERS):
        mine = apply_journals([], data, LOG, lambda t, p, i=index: owner_of(t, p, WORKERS) == i)
        assert sorted(t.name for t in mine) == sorted(
            n for n in names if owner_of(n, 0, WORKERS) == index
        )


def test_a_snapshot_removes_only_the_journals_it_holds(tmp_path):
    data = str(tmp_path)
    journal = MetadataJournal(data, 0, owns_every_file=True)
    journal.put(TopicMetadata("before"))
    held = journal.rotate()  # the snapshot is taken here
    journal.put(TopicMetadata("after"))  # a change while it is written
    journal.written(held)
    for path in held:
        os.unlink(path)
    assert _names(apply_journals([], data, LOG)) == {("after", None): []}
    assert journal.rotate() == [journal_files(data)[0][2]]


# -- the daemon ------------------------------------------------------------------------------


def _make_and_change(http: str, topics: list[str]) -> None:
    """Topics with two channels each, one channel paused, one limit set, one channel and one
    topic deleted: each answered."""
    for topic in topics:
        post(http, f"/topic/create?topic={topic}")
        for channel in ("c0", "c1", "doomed"):
            post(http, f"/channel/create?topic={topic}&channel={channel}")
        post(http, f"/channel/delete?topic={topic}&channel=doomed")
    post(http, f"/channel/setmaxattempts?topic={topics[0]}&channel=c0&max_attempts=7")
    post(http, "/topic/create?topic=doomed_topic")
    post(http, "/topic/delete?topic=doomed_topic")


def _check(http: str, topics: list[str]) -> None:
    found = {
        topic["topic_name"]: sorted(c["channel_name"] for c in topic["channels"])
        for topic in get_json(http, "/stats?format=json")["topics"]
    }
    assert found == {topic: ["c0", "c1"] for topic in topics}
    (c0,) = [
        channel
        for channel in get_json(http, f"/stats?format=json&topic={topics[0]}")["topics"][0][
            "channels"
        ]
        if channel["channel_name"] == "c0"
    ]
    assert c0["max_attempts"] == 7


@pytest.mark.parametrize("workers", [1, WORKERS])
def test_every_answered_creation_and_deletion_survives_a_kill_9_at_once(tmp_path, workers):
    topics = topics_on_both(40)
    daemon = start_nsqd(tmp_path, f"-workers={workers}")
    try:
        _make_and_change(daemon.addresses["HTTP"], topics)
    finally:
        daemon.kill()  # right after the last answer: nsqd.dat has not caught up
    restarted = start_nsqd(tmp_path, f"-workers={workers}")
    try:
        _check(restarted.addresses["HTTP"], topics)
    finally:
        assert restarted.stop() == 0, restarted.log
    # A clean exit leaves Go's file alone, with every topic.
    assert journal_files(str(tmp_path)) == []
    assert sorted(t.name for t in read_metadata(str(tmp_path))) == sorted(topics)


def test_a_killed_worker_finds_its_answered_topics_in_its_journal(tmp_path):
    topics = topics_on_both(20)
    daemon = start_nsqd(tmp_path, f"-workers={WORKERS}")
    try:
        http = daemon.addresses["HTTP"]
        _make_and_change(http, topics)
        first, _second = worker_pids(daemon)
        os.kill(first, signal.SIGKILL)
        daemon.wait_for_log(r"WORKER\(\d\): exited with status -9; starting it again")
        poll(lambda: len(worker_pids(daemon)) == WORKERS, "the worker started again")
        poll(lambda: _served(http, topics), "every topic served again")
        _check(http, topics)
    finally:
        assert daemon.stop() == 0, daemon.log


def _served(http: str, topics: list[str]) -> bool:
    try:
        shown = get_json(http, "/stats?format=json")["topics"]
    except (OSError, AssertionError):
        return False
    return len(shown) == len(topics)


def test_the_journals_go_once_nsqd_dat_holds_them(tmp_path):
    daemon = start_nsqd(tmp_path)
    try:
        topics = [f"t{n}" for n in range(30)]
        _make_and_change(daemon.addresses["HTTP"], topics)

        def caught_up() -> bool:
            held = {t.name: [c.name for c in t.channels] for t in read_metadata(str(tmp_path))}
            return held == {t: ["c0", "c1"] for t in topics} and not journal_files(str(tmp_path))

        poll(caught_up, "nsqd.dat with every topic and no journal left")
    finally:
        assert daemon.stop() == 0, daemon.log
