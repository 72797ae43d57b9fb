"""The cyclic collector is paused for a policy tick and resumed as it was found."""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

import pytest

from services.core import gcpause
from services.core.gcpause import cyclic_gc_paused
from services.core.model import IntentSpec, NodeState, PlanInput
from services.core.policies import parfusion as family
from services.core.policies import reference
from services.core.policies.registry import POLICIES, get_policy


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
def test_every_policy_ticks_with_the_collector_paused(name, monkeypatch):
    """Wraps the real pause to record the collector's state inside the tick."""
    gc.enable()
    seen = []
    real = gcpause.cyclic_gc_paused

    @contextmanager
    def watching():
        with real():
            seen.append(gc.isenabled())
            yield

    monkeypatch.setattr(family, "cyclic_gc_paused", watching)
    monkeypatch.setattr(reference, "cyclic_gc_paused", watching)
    spec = IntentSpec(id="a", name="a", workload_class="BATCH")
    result = get_policy(name).allocate(PlanInput(intents=[spec], node=NodeState("n", 4)))
    assert len(result.decisions) == 1
    assert seen == [False]
    assert gc.isenabled()
