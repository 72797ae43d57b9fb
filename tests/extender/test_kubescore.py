"""kube-scheduler's default formulas, checked against hand-computed values."""

from __future__ import annotations

import numpy as np

from services.extender.kubescore import (
    ClusterResources,
    extender_contribution,
    num_feasible_nodes_to_find,
    select_host,
)

GI = 1 << 30


def test_num_feasible_nodes_to_find_matches_kube_scheduler() -> None:
    assert num_feasible_nodes_to_find(50) == 50
    assert num_feasible_nodes_to_find(100) == 100  # 49 % of 100, raised to the 100 minimum
    assert num_feasible_nodes_to_find(1000) == 420  # 50 - 1000/125 = 42 %
    assert num_feasible_nodes_to_find(5000) == 500  # 10 %: the "500 node names" at 5,000 nodes
    assert num_feasible_nodes_to_find(10000) == 500  # floor of 5 %
    assert num_feasible_nodes_to_find(1000, percentage=100) == 1000


def test_least_allocated_plus_balanced() -> None:
    res = ClusterResources.empty(
        np.array([4000, 8000]), np.array([8 * GI, 8 * GI]), np.array([110, 110])
    )
    res.assume(0, 1000, 2 * GI)
    scores = res.scores(np.array([0, 1]), 1000, 2 * GI)
    # node 0: cpu (4000-2000)*100/4000 = 50, mem (8-4)*100/8 = 50 -> 50; balanced |.5-.5|/2=0 -> 100
    # node 1: cpu (8000-1000)*100/8000 = 87, mem (8-2)*100/8 = 75 -> 81; balanced 1-|.125-.25|/2 -> 93
    assert scores.tolist() == [150, 81 + 93]


def test_fit_filter_and_rotating_start() -> None:
    n = 300
    res = ClusterResources.empty(np.full(n, 4000), np.full(n, 8 * GI), np.full(n, 110))
    res.req_cpu_m[::2] = 3500  # even nodes are full
    first = res.feasible_candidates(1000, GI)
    assert len(first) == 144 and all(i % 2 == 1 for i in first)  # 48 % of 300 nodes
    assert first[0] == 1 and res.next_start == 288
    second = res.feasible_candidates(1000, GI)
    assert second[0] == 289  # the next cycle starts where the last one stopped


def test_extender_weight_and_ties() -> None:
    assert extender_contribution(np.array([10, 3]), 5).tolist() == [500, 150]
    rng = np.random.default_rng(1)
    picks = {select_host(np.array([7, 9, 9, 2]), rng) for _ in range(50)}
    assert picks == {1, 2}
