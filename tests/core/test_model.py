"""The core's plain data types keep the promises their definitions make."""

from __future__ import annotations

import gc
import typing

from services.core.model import Decision

# what a field of an untracked Struct may hold: values that can refer to nothing else
_ATOMIC = (str, int, float, bool)


def _atomic(hint: object) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return all(isinstance(v, _ATOMIC) for v in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        return all(a is Ellipsis or _atomic(a) for a in args)
    return hint in _ATOMIC


def test_decisions_stay_out_of_the_cyclic_collector_and_can_form_no_cycle() -> None:
    """Decision is declared gc=False: every field must hold only values that refer to nothing
    (a list or another Struct could close a cycle the collector would never see)."""
    hints = typing.get_type_hints(Decision, include_extras=False)
    assert hints and all(_atomic(h) for h in hints.values()), {
        name: h for name, h in hints.items() if not _atomic(h)
    }
    decisions = tuple(Decision(intent_id=f"i{k}", units=k, cpu_set=(k, k + 1)) for k in range(3))
    by_id = {d.intent_id: d for d in decisions}
    gc.collect()
    assert not any(gc.is_tracked(d) for d in decisions)
    # the containers of a tick's decisions are left out too, so a collection skips them
    assert not gc.is_tracked(decisions) and not gc.is_tracked(by_id)
