"""State sent as deltas against a generation both sides know, with a full resync on doubt.

The allocator's plans to the node agent and the agent's telemetry back are keyed collections
(one allocation, one pool per intent). Each side that sends keeps, per key, the serialized entry
the receiver holds and that state's generation; a new state goes out as the entries whose bytes
changed plus the keys that left, tagged with the generation it is relative to (0: everything).
The receiver applies a delta only when its base is the generation it holds; any doubt (a lost
reply, a restart on either side, a base it does not hold) ends in a full state, never in two
sides that disagree. Entries are compared as bytes, so "changed" is exact.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from services.common.memory import ShrinkWatch


@dataclass(frozen=True)
class Delta:
    """What to send: ``base`` 0 means ``changed`` is the whole state."""

    base: int
    changed: list[str]  # keys whose entry is new or different, in the state's order
    removed: list[str]  # keys the receiver holds that left


class DeltaSender:
    """The sending side: what the receiver holds, as far as this side knows for certain."""

    def __init__(self) -> None:
        self._held: dict[str, bytes] | None = None  # None: unknown, send everything
        self.held_generation = 0
        self._shrink = ShrinkWatch()  # the table is rebuilt after a large shrink (memory.py)

    def diff(self, entries: Mapping[str, bytes], present: Collection[str] | None = None) -> Delta:
        """The delta from what is held to ``entries``; with ``present`` (every key the state
        has now), ``entries`` need only hold the keys that may have changed."""
        held = self._held
        if held is None:
            return Delta(0, list(entries), [])
        changed = [k for k, v in entries.items() if held.get(k) != v]
        if present is not None:
            return Delta(self.held_generation, changed, [k for k in held if k not in present])
        added = sum(1 for k in changed if k not in held)
        # every held key is still there when the kept ones and the added ones make up `entries`
        gone = len(held) + added != len(entries)
        removed = [k for k in held if k not in entries] if gone else []
        return Delta(self.held_generation, changed, removed)

    def diff_since(
        self,
        base: int,
        changed: Iterable[str],
        removed: Iterable[str],
        entries: Mapping[str, bytes],
    ) -> Delta:
        """The delta to ``entries``, given that they are the state of generation ``base`` with
        the keys ``changed`` set and ``removed`` gone: those, when the receiver holds exactly
        ``base`` (nothing compared); else ``diff(entries)``."""
        if self._held is not None and base and base == self.held_generation:
            return Delta(base, list(changed), list(removed))
        return self.diff(entries)

    def advance(self, delta: Delta, entries: Mapping[str, bytes], generation: int) -> None:
        """The receiver applied ``delta`` (its changed keys' entries taken from ``entries``)."""
        if self._held is None or not delta.base:
            self._held = {}
        for k in delta.removed:
            self._held.pop(k, None)
        for k in delta.changed:
            self._held[k] = entries[k]
        if self._shrink.shrunk(len(self._held)):
            self._held = dict(self._held)
        self.held_generation = generation

    def forget(self) -> None:
        """Unknown what the receiver holds (a failed call, a resync asked): send everything."""
        self._held = None
        self.held_generation = 0


class HeldState:
    """The receiving side: the entries at one generation, changed only by a matching delta."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}
        self.generation = 0
        self._shrink = ShrinkWatch()  # the table is rebuilt after a large shrink (memory.py)

    def accepts(self, base: int, removed: Iterable[str] = ()) -> bool:
        """Whether a delta against ``base`` removing ``removed`` applies to what is held."""
        if base == 0:
            return True
        return base == self.generation and all(k in self.entries for k in removed)

    def apply(
        self, base: int, generation: int, changed: Mapping[str, bytes], removed: Iterable[str]
    ) -> bool:
        """Apply a delta (or a whole state, base 0); False, nothing changed, if it does not fit."""
        removed = list(removed)
        if not self.accepts(base, removed):
            return False
        if base == 0:
            self.entries = dict(changed)
        else:
            for k in removed:
                del self.entries[k]
            self.entries.update(changed)
        if self._shrink.shrunk(len(self.entries)):
            self.entries = dict(self.entries)
        self.generation = generation
        return True

    def clear(self) -> None:
        self.entries = {}
        self.generation = 0
