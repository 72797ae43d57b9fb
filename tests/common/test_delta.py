"""Deltas against a generation both sides know: after any sequence of states, lost deltas,
duplicated deltas and restarts, a receiver that says it holds a generation holds exactly the
state of that generation, and a sender that gets a refusal sends the whole state next."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.delta import DeltaSender, HeldState

KEYS = st.sampled_from([f"i{k}" for k in range(8)])
STATES = st.dictionaries(KEYS, st.binary(max_size=3), max_size=8)
# what happens to each delta on its way: delivered, lost (and the sender does not know whether
# it arrived: it guesses it did), duplicated (delivered twice), or the receiver restarts first
FATES = st.sampled_from(["delivered", "lost", "duplicated", "restart"])


def send(
    sender: DeltaSender,
    receiver: HeldState,
    state: dict[str, bytes],
    gen: int,
    fate: str,
    before: dict[str, bytes] | None = None,
) -> None:
    """Send ``state`` as generation ``gen``: the delta found by comparing every entry, or with
    ``before`` (the state of the generation before) as the allocator's loop does it, from the
    changes its allocation cache knows, used as they are when the receiver holds that one."""
    if before is None:
        delta = sender.diff(state)
    else:
        changed = [k for k, v in state.items() if before.get(k) != v]
        removed = [k for k in before if k not in state]
        delta = sender.diff_since(gen - 1, changed, removed, state)
    entries = {k: state[k] for k in delta.changed}
    if fate == "restart":
        receiver.clear()
    accepted = False
    if fate != "lost":
        accepted = receiver.apply(delta.base, gen, entries, delta.removed)
        if fate == "duplicated":
            receiver.apply(delta.base, gen, entries, delta.removed)
    if fate == "lost" or accepted:
        sender.advance(delta, state, gen)  # a lost reply: the sender guesses it was applied
    else:
        sender.forget()  # resync_required


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(STATES, FATES), min_size=1, max_size=12), st.booleans())
def test_both_sides_agree_whenever_the_receiver_holds_the_generation(steps, since) -> None:
    sender, receiver = DeltaSender(), HeldState()
    states: dict[int, dict[str, bytes]] = {0: {}}

    for gen, (state, fate) in enumerate(steps, start=1):
        states[gen] = state
        send(sender, receiver, state, gen, fate, states[gen - 1] if since else None)
        # whatever generation the receiver holds, it holds that generation's state exactly
        assert receiver.entries == states[receiver.generation]
    # and two clean rounds later both sides agree on the newest state, lost or not before
    last = len(steps) + 1
    for gen in (last, last + 1):
        states[gen] = steps[-1][0]
        send(sender, receiver, steps[-1][0], gen, "delivered", states[gen - 1] if since else None)
    assert receiver.generation == last + 1
    assert receiver.entries == steps[-1][0]


def test_a_delta_carries_only_what_changed() -> None:
    sender, receiver = DeltaSender(), HeldState()
    state = {f"i{k}": str(k).encode() for k in range(1000)}
    first = sender.diff(state)
    assert first.base == 0 and len(first.changed) == 1000
    assert receiver.apply(0, 1, {k: state[k] for k in first.changed}, first.removed)
    sender.advance(first, state, 1)
    state = dict(state)
    state["i3"] = b"new"
    del state["i7"]
    state["i1000"] = b"added"
    delta = sender.diff(state)
    assert (delta.base, delta.changed, delta.removed) == (1, ["i3", "i1000"], ["i7"])
    assert receiver.apply(1, 2, {k: state[k] for k in delta.changed}, delta.removed)
    assert receiver.entries == state


def test_a_delta_against_another_generation_changes_nothing() -> None:
    receiver = HeldState()
    assert receiver.apply(0, 5, {"a": b"1"}, [])
    assert not receiver.apply(4, 6, {"b": b"2"}, [])
    assert not receiver.apply(5, 6, {}, ["missing"])  # removes what is not held: disagreement
    assert (receiver.generation, receiver.entries) == (5, {"a": b"1"})


def test_both_sides_rebuild_their_tables_after_most_keys_left() -> None:
    sender, receiver = DeltaSender(), HeldState()
    full = {f"k{i}": b"x" for i in range(2000)}
    sender.advance(sender.diff(full), full, 1)
    receiver.apply(0, 1, full, [])
    peak = sys.getsizeof(receiver.entries)
    left = {"k7": b"x"}
    delta = sender.diff(left)
    assert len(delta.removed) == 1999 and not delta.changed
    assert receiver.apply(delta.base, 2, {}, delta.removed)
    sender.advance(delta, left, 2)
    assert receiver.entries == left and sender.diff(left).removed == []
    most = sys.getsizeof(dict.fromkeys(range(8)))
    assert max(sys.getsizeof(receiver.entries), sys.getsizeof(sender._held)) <= most < peak


def test_changes_against_the_held_generation_are_the_delta_as_given() -> None:
    """diff_since compares nothing when the receiver holds the changes' base (the loop's
    allocation cache knows them); against any other generation it compares every entry."""
    sender = DeltaSender()
    held = {"a": b"1", "b": b"2"}
    sender.advance(sender.diff(held), held, 3)
    new = {"a": b"1", "b": b"3", "c": b"4"}
    given = sender.diff_since(3, ["c"], [], new)  # deliberately short: taken as given
    assert (given.base, given.changed, given.removed) == (3, ["c"], [])
    other = sender.diff_since(2, ["c"], [], new)  # another base: compared
    assert (other.base, other.changed, other.removed) == (3, ["b", "c"], [])
    sender.forget()  # held unknown: the whole state
    whole = sender.diff_since(3, ["c"], [], new)
    assert (whole.base, sorted(whole.changed)) == (0, ["a", "b", "c"])
