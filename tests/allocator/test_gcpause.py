"""The allocator's loop pauses the cyclic collector for a tick and resumes it as it was found;
the policies themselves leave the collector alone (the core keeps no process-wide state)."""

from __future__ import annotations

import gc
import threading

import pytest

from services.allocator import gcpause
from services.allocator import loop as loop_module
from services.allocator.gcpause import cyclic_gc_paused
from services.allocator.loop import ControlLoop, LoopConfig
from services.allocator.store import IntentStore
from services.core.model import IntentSpec, NodeState, PlanInput, PlanResult
from services.core.policies.registry import POLICIES, get_policy
from services.core.validation import normalize_intent
from tests.allocator.conftest import batch_intent


@pytest.fixture(autouse=True)
def _collector_restored():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_resumed_after():
    gc.enable()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gcpause._depth == 0


def test_resumed_when_the_tick_raises():
    gc.enable()
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        raise RuntimeError("tick failed")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_process_stays_off():
    gc.disable()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_ticks_resume_only_when_the_last_one_ends():
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def other_tick():
        with cyclic_gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other_tick)
    t.start()
    assert inside.wait(10)
    with cyclic_gc_paused():
        pass
    assert not gc.isenabled()  # the other tick is still running
    release.set()
    t.join(10)
    assert gc.isenabled()


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_policy_leaves_the_collector_alone(name):
    gc.enable()
    spec = IntentSpec(id="a", name="a", workload_class="BATCH")
    result = get_policy(name).allocate(PlanInput(intents=[spec], node=NodeState("n", 4)))
    assert len(result.decisions) == 1
    assert gc.isenabled()


def test_the_loop_ticks_and_previews_with_the_collector_paused(tmp_path, monkeypatch):
    """The loop's policy records the collector's state inside its ticks and previews."""
    gc.enable()
    seen = []
    store = IntentStore(tmp_path / "allocator.db")

    class Watching:
        name, kind, description = "watching", "ablation", "records the collector's state"

        def allocate(self, state: PlanInput) -> PlanResult:
            seen.append(gc.isenabled())
            return get_policy("parfusion").allocate(state)

    monkeypatch.setattr(loop_module, "get_policy", lambda name: Watching())
    try:
        store.submit(normalize_intent(batch_intent()))
        loop = ControlLoop(store, LoopConfig())
        assert loop.tick() is not None
        loop.preview()
    finally:
        store.close()
    assert seen == [False, False]
    assert gc.isenabled()
