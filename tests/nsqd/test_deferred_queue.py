"""A classic channel's deferred messages as compact entries (nsqd/deferred_queue.py): held
to `DeadlineQueue`, which keeps the Messages themselves, by random operations."""

from hypothesis import given
from hypothesis import strategies as st

from nsqpy.nsqd.deferred_queue import DeferredQueue
from nsqpy.nsqd.inflight import DeadlineQueue
from nsqpy.nsqd.message import Message


def _message(number: int, *, traced: bool) -> Message:
    message = Message(b"%016d" % number, b"body %d" % number, 1_700_000_000_000_000_000 + number, 2)
    message.offset = number * 40
    if traced:
        message.trace_id = number + 1  # kept as the Message itself
    return message


def _seen(messages: list[Message]) -> list[tuple]:
    return [
        (m.id, m.body, m.timestamp, m.attempts, m.offset, m.trace_id, m.deadline) for m in messages
    ]


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 30), st.integers(0, 20), st.booleans()),
        st.tuples(st.just("pop"), st.integers(0, 30)),
        st.tuples(st.just("due"), st.integers(0, 20)),
    ),
    max_size=80,
)


@given(OPERATIONS)
def test_deferred_queue_gives_back_what_a_deadline_queue_does(operations):
    compact, model = DeferredQueue(), DeadlineQueue()
    for operation in operations:
        if operation[0] == "push":
            _kind, number, due, traced = operation
            # Each queue its own object, as a REQ gives it the message it popped.
            compact.push(_message(number, traced=traced), float(due))
            model.push(_message(number, traced=traced), float(due))
        elif operation[0] == "pop":
            number = operation[1]
            assert _seen([m for m in [compact.pop(b"%016d" % number)] if m]) == _seen(
                [m for m in [model.pop(b"%016d" % number)] if m]
            )
        else:
            due_compact = compact.pop_due(float(operation[1]))
            due_model = model.pop_due(float(operation[1]))
            # Earliest first; among one due time, any order.
            assert [m.deadline for m in due_compact] == sorted(m.deadline for m in due_compact)
            assert sorted(_seen(due_compact)) == sorted(_seen(due_model))
        assert len(compact) == len(model)
        assert sorted(_seen(list(compact))) == sorted(_seen(list(model)))
    assert sorted(_seen(compact.clear())) == sorted(_seen(model.clear()))
    assert len(compact) == 0


def test_messages_finished_before_they_are_due_do_not_stay_on_the_heap():
    queue = DeferredQueue()
    for number in range(10_000):
        queue.push(_message(number, traced=False), 3600.0)
        queue.pop(b"%016d" % number)
    queue.push(_message(1, traced=False), 3600.0)
    assert len(queue._heap) <= 2 * 1024
    assert [m.id for m in queue.pop_due(3600.0)] == [b"%016d" % 1]
