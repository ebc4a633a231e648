"""`/topic/fixdata` on one nsqd (docs/operations.md, "Corrupt data"): a log topic whose
retention has run, with old groups gone bad on its disk (zeroed blocks, as a crash or a bad
disk leaves them, the index intact). With no other replica to copy from, a corrupt tail is
cut off and a corrupt group inside the log is skipped exactly: its channel reads everything
else, and the partition takes and delivers publishes as before. Real nsqd processes,
`--log-topic=lt`, channel `c`. Its race with `/topic/delete` is in
tests/nsqd/test_deletion_races.py."""

from nsqpy.common.command import encode_mpub
from nsqpy.partition_log.view import LogView
from tests.harness import V2Connection, http_request, start_nsqd
from tests.nsqd.log_topic_client import FLAGS, channel_stats, create_channel, subscribe
from tests.support.polling import poll

ARGS = (*FLAGS, "--max-bytes-per-file=2048")


def publish_groups(port: int, label: bytes, groups: int) -> list[bytes]:
    """`groups` MPUBs of 5 bodies each (one index entry each); the bodies."""
    connection = V2Connection(port)
    bodies = []
    for group in range(groups):
        batch = [b"%s %03d %d" % (label, group, n) for n in range(5)]
        connection.send(encode_mpub(b"lt", batch))
        assert connection.read_response().data == b"OK"
        bodies += batch
    connection.close()
    return bodies


def consume(connection: V2Connection, count: int) -> list[bytes]:
    bodies = []
    while len(bodies) < count:
        (message,) = connection.read_messages(1)
        connection.send(b"FIN " + message.id + b"\n")
        bodies.append(message.body)
    return bodies


def zero(data_path, entries: list[tuple]) -> None:
    view = LogView(str(data_path), "lt", 0)
    try:
        for entry in entries:
            segment = [s for s in view.segments if s.start <= entry[3]][-1]
            with open(view.files.segment(segment.number), "r+b") as data:
                data.seek(entry[3] - segment.start)
                data.write(bytes(entry[4]))
    finally:
        view.close()


def index_entries(data_path) -> list[tuple]:
    view = LogView(str(data_path), "lt", 0)
    try:
        first = view.first_retained
        return view.index.entries(first, view.index.total - first)
    finally:
        view.close()


def test_fixdata_cuts_a_corrupt_tail_and_skips_a_corrupt_group_of_an_aged_log(tmp_path):
    daemon = start_nsqd(tmp_path, *ARGS)
    try:
        create_channel(daemon)
        consumed = publish_groups(daemon.port("TCP"), b"old", 40)
        connection = subscribe(daemon.port("TCP"), 50)
        assert consume(connection, len(consumed)) == consumed
        connection.close()
        poll(lambda: channel_stats(daemon)["depth"] == 0, "the old messages confirmed")
        http_request(daemon.port("HTTP"), "POST", "/topic/greedyclean?topic=lt")
        kept = publish_groups(daemon.port("TCP"), b"kept", 12)
        daemon.stop()

        entries = index_entries(tmp_path)
        assert entries[0][3] > 0, "retention removed nothing"
        # The sixth unconsumed group, and the last two (the tail).
        middle, tail = entries[-12 + 5], entries[-2:]
        zero(tmp_path, [middle, *tail])
        daemon = start_nsqd(tmp_path, *ARGS)
        # Without checkcorrupt only the first and the last group are checked: the last goes.
        assert http_request(daemon.port("HTTP"), "POST", "/topic/fixdata?topic=lt") == b""
        assert index_entries(tmp_path)[-1] == entries[-2]
        fixdata = "/topic/fixdata?topic=lt&checkcorrupt=true"
        assert http_request(daemon.port("HTTP"), "POST", fixdata) == b""
        assert index_entries(tmp_path)[-1] == entries[-3]
        lost = set(kept[25:30]) | set(kept[-10:])
        connection = subscribe(daemon.port("TCP"), 50)
        expected = [body for body in kept if body not in lost]
        assert consume(connection, len(expected)) == expected
        after = publish_groups(daemon.port("TCP"), b"after", 2)
        assert consume(connection, len(after)) == after
        poll(lambda: channel_stats(daemon)["depth"] == 0, "everything confirmed")
        connection.close()
    finally:
        daemon.stop()
