"""DeadlineQueue, the in-flight and deferred queues: by ID for FIN, by deadline for the queue
scan, with lazy deletion from the heap and a rebuild that keeps memory bounded by what is
really in flight."""

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.nsqd.inflight import _MIN_REFERENCES_FOR_REBUILD, DeadlineQueue
from nsqpy.nsqd.message import Message


def message(number: int) -> Message:
    return Message(b"%016x" % number, b"body", 0)


def test_pop_due_hands_out_what_is_due_earliest_first():
    queue = DeadlineQueue()
    a, b, c, d = (message(n) for n in range(4))
    queue.push(a, 3.0)
    queue.push_batch([b, c], 1.0)
    queue.push(d, 2.0)
    assert queue.pop_due(0.5) == []
    assert queue.pop_due(2.0) == [b, c, d]
    assert len(queue) == 1 and a.id in queue
    assert queue.pop_due(10.0) == [a]
    assert len(queue) == 0


def test_finished_and_touched_messages_leave_stale_entries_behind():
    queue = DeadlineQueue()
    finished, touched, waiting = message(1), message(2), message(3)
    queue.push_batch([finished, touched, waiting], 1.0)
    assert queue.pop(finished.id) is finished  # FIN
    queue.reschedule(touched, 5.0)  # TOUCH
    assert queue.pop_due(1.0) == [waiting]
    assert queue.get(touched.id) is touched
    assert queue.pop_due(4.9) == []
    assert queue.pop_due(5.0) == [touched]


def test_clear_returns_every_live_message():
    queue = DeadlineQueue()
    messages = [message(n) for n in range(5)]
    queue.push_batch(messages[:3], 1.0)
    queue.push_batch(messages[3:], 2.0)
    queue.pop(messages[0].id)
    assert sorted(m.id for m in queue.clear()) == sorted(m.id for m in messages[1:])
    assert len(queue) == 0 and queue.pop_due(10.0) == []


def test_references_to_finished_messages_are_purged_when_they_outnumber_the_live_ones():
    """A consumer that FINs long before the timeout leaves a heap entry per delivery: the
    rebuild must run, so memory follows what is in flight, not what was ever delivered."""
    queue = DeadlineQueue()
    live = []
    for number in range(4 * _MIN_REFERENCES_FOR_REBUILD):
        delivered = message(number)
        queue.push(delivered, 100.0 + number)
        if number % 10:
            queue.pop(delivered.id)  # FINished at once
        else:
            live.append(delivered)
        # What the heap holds never grows past twice what is in flight (plus the threshold).
        assert queue._references <= max(_MIN_REFERENCES_FOR_REBUILD, 2 * len(queue)) + 1
    assert len(queue) == len(live)
    assert queue.pop_due(float("inf")) == live


operations = st.lists(
    st.tuples(
        st.sampled_from(["push", "batch", "fin", "touch", "due"]),
        st.integers(0, 40),
        st.integers(0, 20),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_the_queue_agrees_with_a_plain_model(steps):
    queue = DeadlineQueue()
    model: dict[bytes, tuple[float, Message]] = {}
    made: dict[int, Message] = {}
    for operation, number, when in steps:
        item = made.setdefault(number, message(number))
        if operation in ("push", "touch") and (operation == "push" or item.id in model):
            queue.push(item, float(when))
            model[item.id] = (float(when), item)
        elif operation == "batch":
            batch = [made.setdefault(n, message(n)) for n in range(number, number + 3)]
            queue.push_batch(batch, float(when))
            for entry in batch:
                model[entry.id] = (float(when), entry)
        elif operation == "fin":
            expected = model.pop(item.id, (None, None))[1]
            assert queue.pop(item.id) is expected
        elif operation == "due":
            due = queue.pop_due(float(when))
            expected = {mid for mid, (deadline, _m) in model.items() if deadline <= when}
            assert {m.id for m in due} == expected
            assert [m.deadline for m in due] == sorted(m.deadline for m in due)
            for mid in expected:
                del model[mid]
        assert len(queue) == len(model)
    remaining = queue.pop_due(float("inf"))
    assert {m.id for m in remaining} == set(model)
