"""`RunHeap`: entries come out smallest first whatever order they went in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tickwheel.common.runheap import RunHeap

entries = st.tuples(st.integers(0, 5), st.integers(0, 20), st.integers(0, 50)).map(
    lambda key: (*key, key[0] << 40 | key[1] << 20 | key[2], 0, 0))
operations = st.lists(st.one_of(
    st.tuples(st.just("push"), entries),
    st.tuples(st.just("extend"), st.lists(entries, max_size=20)),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("pop_unpop"), st.none()),
    st.tuples(st.just("clear"), st.none()),
    st.tuples(st.just("keep"), st.integers(2, 4)),
), max_size=200)


@given(operations)
def test_the_queue_gives_back_the_smallest_entry_every_time(steps: list) -> None:
    queue, model = RunHeap[tuple[int, ...]](), list[tuple[int, ...]]()
    for kind, value in steps:
        if kind == "push":
            queue.push(value)
            model.append(value)
        elif kind == "extend":
            queue.extend(list(value))
            model += value
        elif kind == "clear":
            queue.clear()
            model.clear()
        elif kind == "keep":  # drop the entries whose third field the divisor does not divide
            queue.keep(lambda entry, divisor=value: entry[2] % divisor == 0)
            model = [entry for entry in model if entry[2] % value == 0]
        elif model:
            expected = min(model)
            assert queue.first() == expected
            taken = queue.pop()
            assert taken == expected
            if kind == "pop_unpop":
                queue.unpop(taken)
            else:
                model.remove(taken)
        assert len(queue) == len(model)
        assert queue.first() == (min(model) if model else None)


def test_entries_in_order_stay_out_of_the_heap() -> None:
    """The usual load, entries in order (messages filed in due order, leases granted in
    that order), never pays for the heap."""
    queue = RunHeap[tuple[int, ...]]()
    for index in range(1_000):
        queue.push((7, 1_000 + index, index, index, 0, 0))
    assert len(queue._heap) == 0
    assert [queue.pop()[2] for _ in range(1_000)] == list(range(1_000))
