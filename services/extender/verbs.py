"""The extender verbs as plain calls: filter, prioritize, bind, preempt.

The HTTP app decodes a request, calls one of these and writes the reply; the cluster simulator
calls :meth:`Extender.filter_rows` / :meth:`Extender.prioritize_rows` in-process on the
same node records, so both run exactly the same decisions.

Contract with kube-scheduler: a pod without an intent passes /filter untouched and scores 0 on
every node (no preference); an invalid intent fails every node as unresolvable with the
validation message, so ``kubectl describe pod`` shows why. kube-scheduler skips /prioritize when
one node is left and ignores its errors, so /bind re-checks the chosen node under a lock and
reserves the capacity before binding.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from services.core.model import IntentSpec

from . import protocol
from .kubeapi import KubeApi, api_error_message
from .metrics import ExtenderMetrics
from .nodeview import Binding, ClusterView
from .podintent import NO_INTENT, PodIntent, pod_intent
from .protocol import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs
from .scoring import (
    FAILED,
    OK,
    UNRESOLVABLE,
    ClassScores,
    NodeDecision,
    ScoringConfig,
    Verdicts,
    decide,
)

log = logging.getLogger(__name__)

OUTCOME_LABEL = {0: "kept", 1: "failed", 2: "unresolvable"}


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    kept: list[int]  # indexes into the candidate list
    failed: dict[str, str]
    unresolvable: dict[str, str]
    intent: PodIntent


def shortlist(feasible: np.ndarray, verdicts: Verdicts, limit: int, intent_id: str) -> np.ndarray:
    """The at most `limit` best of the feasible candidates (indexes, kept in candidate order):
    highest score, then most slack, then a turn of the candidate list keyed by the intent, so
    that pods whose candidates tie do not all get the same few nodes. 0: every feasible one.

    The others are left out of the answer without a reason: kube-scheduler drops a candidate
    the reply does not name, and a pod with any feasible node always keeps some."""
    if limit <= 0 or feasible.size <= limit:
        return feasible
    n = len(verdicts)
    turn = (feasible + zlib.crc32(intent_id.encode()) % n) % n
    order = np.lexsort((turn, -verdicts.slack_ms[feasible], -verdicts.score[feasible]))
    return np.sort(feasible[order[:limit]])


class Extender:
    def __init__(
        self,
        view: ClusterView,
        config: ScoringConfig | None = None,
        api: KubeApi | None = None,
        metrics: ExtenderMetrics | None = None,
        recent_limit: int = 100,
        pod_cache_size: int = 10_000,
    ) -> None:
        self.view = view
        self.config = config or ScoringConfig()
        self.api = api
        self.metrics = metrics or ExtenderMetrics()
        self.recent: deque[dict[str, Any]] = deque(maxlen=recent_limit)
        self._pods: OrderedDict[str, IntentSpec] = OrderedDict()  # uid or ns/name -> intent
        self._pod_cache_size = pod_cache_size
        self._bind_lock = threading.Lock()
        self._class_scores: OrderedDict[IntentSpec, ClassScores] = OrderedDict()
        # nodes whose NodeIntentState went stale (nodestates.py): scored 0 by /prioritize
        self.stale_nodes: frozenset[str] = frozenset()

    def scores_for(self, spec: IntentSpec) -> ClassScores:
        """The per-class score cache of an intent; replicas (same intent but id and name) share."""
        key = replace(spec, id="", name="", node="", seq=0)
        table = self._class_scores.get(key)
        if table is None:
            table = {}
            self._class_scores[key] = table
            while len(self._class_scores) > 256:
                self._class_scores.popitem(last=False)
        return table

    def _decide(self, spec: IntentSpec, rows: np.ndarray) -> Verdicts:
        return decide(spec, rows, self.view.columns, self.config, self.scores_for(spec))

    @property
    def bind_mode(self) -> str:
        return "api" if self.api is not None else "standalone"

    # --- shared pieces --------------------------------------------------------------------

    def _intent(self, pod: protocol.Pod, verb: str) -> PodIntent:
        found = pod_intent(pod)
        label = "invalid" if found.error else (found.source or "none")
        self.metrics.pods.labels(verb, label).inc()
        if found.spec is not None:
            self._remember(pod, found.spec)
        return found

    def _remember(self, pod: protocol.Pod, spec: IntentSpec) -> None:
        for key in (pod.metadata.uid, pod.key):
            if key:
                self._pods[key] = spec
                self._pods.move_to_end(key)
        while len(self._pods) > self._pod_cache_size:
            self._pods.popitem(last=False)

    def rows(self, args: ExtenderArgs) -> np.ndarray:
        """The candidates' rows in the node view; a NodeList teaches the view its nodes first."""
        if args.nodes is not None:
            self.view.learn(args.heads)
        return self.view.columns.candidates(args.candidate_names(), args.names_key).rows

    # --- filter -----------------------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> bytes:
        names = args.candidate_names()
        found = self._intent(args.pod, "filter")
        if not found.present:
            if args.nodes is not None:
                self.view.learn(args.heads)  # NodeNames calls may need them later
            self.metrics.filter_nodes.labels("passthrough").inc(len(names))
            kept: list[int] | list[str] = (
                list(range(len(names))) if args.nodes is not None else names
            )
            return protocol.encode_filter_result(args, kept, {}, {})
        outcome = self.filter_rows(found, names, self.rows(args))
        self._note("filter", args.pod, found, len(names), outcome)
        kept = (
            outcome.kept if args.nodes is not None else list(map(names.__getitem__, outcome.kept))
        )
        return protocol.encode_filter_result(args, kept, outcome.failed, outcome.unresolvable)

    def filter_rows(
        self, found: PodIntent, names: Sequence[str], rows: np.ndarray
    ) -> FilterOutcome:
        if found.spec is None:
            if not found.present:
                return FilterOutcome(list(range(len(names))), {}, {}, found)
            self.metrics.filter_nodes.labels("unresolvable").inc(len(names))
            return FilterOutcome([], {}, {n: found.error for n in names}, found)
        verdicts = self._decide(found.spec, rows)
        feasible = np.flatnonzero(verdicts.outcome == OK)
        kept = shortlist(feasible, verdicts, self.config.shortlist, found.spec.id).tolist()
        failed = verdicts.failures(names, FAILED)
        unresolvable = verdicts.failures(names, UNRESOLVABLE)
        m = self.metrics.filter_nodes
        m.labels("kept").inc(len(kept))
        if len(kept) < feasible.size:
            m.labels("beyond_shortlist").inc(feasible.size - len(kept))
        m.labels("failed").inc(len(failed))
        m.labels("unresolvable").inc(len(unresolvable))
        return FilterOutcome(kept, failed, unresolvable, found)

    # --- prioritize -------------------------------------------------------------------------

    def prioritize(self, args: ExtenderArgs) -> bytes:
        """Scores 1..10 of the candidates the intent prefers. Hosts scoring 0 are left out:
        kube-scheduler adds nothing for a host the list does not name, so the answer is the
        same in fewer bytes for it to decode (a pod without an intent gets ``[]``)."""
        names = args.candidate_names()
        found = self._intent(args.pod, "prioritize")
        if args.nodes is not None:
            self.view.learn(args.heads)
        if found.spec is None:
            return protocol.encode_host_priorities([], [])
        entry = self.view.columns.candidates(names, args.names_key)
        scores = self.prioritize_rows(found, entry.rows)
        stale = self.stale_nodes
        keep = [i for i, s in enumerate(scores) if s > 0 and not (stale and names[i] in stale)]
        if entry.host_heads is None:
            entry.host_heads = protocol.host_heads(names)
        heads = entry.host_heads  # None: names that need escaping, encoded the slow way
        return protocol.encode_host_priorities(
            [names[i] for i in keep],
            [scores[i] for i in keep],
            None if heads is None else [heads[i] for i in keep],
        )

    def prioritize_rows(self, found: PodIntent, rows: np.ndarray) -> list[int]:
        if found.spec is None:
            return [protocol.MIN_EXTENDER_PRIORITY] * len(rows)
        verdicts = self._decide(found.spec, rows)
        return np.where(verdicts.outcome == OK, verdicts.score, 0).tolist()

    # --- bind -------------------------------------------------------------------------------

    def bind(self, args: ExtenderBindingArgs) -> bytes:
        """Re-check and reserve under the lock, then bind (API or standalone); errors in Error."""
        pod = f"{args.pod_namespace}/{args.pod_name}"
        spec = self._pods.get(args.pod_uid) if args.pod_uid else None
        spec = spec or self._pods.get(pod)
        reserved: IntentSpec | None = None
        with self._bind_lock:
            if spec is not None:
                decision = self.check_node(spec, args.node)
                if decision.outcome != OK:
                    self.metrics.bindings.labels(self.bind_mode, "refused").inc()
                    return protocol.encode_binding_result(
                        f"pod {pod} no longer fits node {args.node}: {decision.reason}"
                    )
                reserved = replace(spec, node=args.node, gpu_lane=decision.lane or spec.gpu_lane)
                self.view.place(args.node, reserved)
        if self.api is not None:
            try:
                self.api.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
            except Exception as exc:  # ApiException, urllib3 errors: all become Error
                if reserved is not None:
                    self.view.forget_placement(reserved.id)
                self.metrics.bindings.labels("api", "error").inc()
                message = api_error_message(exc)
                log.warning("bind failed", extra={"pod": pod, "node": args.node, "error": message})
                return protocol.encode_binding_result(f"binding {pod} to {args.node}: {message}")
        self.view.record_binding(
            Binding(
                pod=pod,
                pod_uid=args.pod_uid,
                node=args.node,
                intent_id=reserved.id if reserved else "",
                at=time.time(),
                mode=self.bind_mode,
            )
        )
        self.metrics.bindings.labels(self.bind_mode, "bound").inc()
        return protocol.encode_binding_result("")

    def check_node(self, spec: IntentSpec, node: str) -> NodeDecision:
        return self._decide(spec, self.view.rows_of([node])).at(0, node)

    # --- preempt ----------------------------------------------------------------------------

    def preempt(self, args: ExtenderPreemptionArgs) -> bytes:
        """Keep the scheduler's victims, minus nodes where the intent could never fit (no lane,
        too few CPUs in all): preempting pods there would only lose work."""
        found = self._intent(args.pod, "preempt")
        if found.spec is None:
            victims = {} if found.present else args.victims
            return protocol.encode_preemption_result(victims)
        names = list(args.victims)
        verdicts = self._decide(found.spec, self.view.rows_of(names))
        outcomes = verdicts.outcome.tolist()
        kept = {
            name: args.victims[name]
            for name, outcome in zip(names, outcomes, strict=True)
            if outcome != UNRESOLVABLE
        }
        return protocol.encode_preemption_result(kept)

    # --- state ------------------------------------------------------------------------------

    def _note(
        self,
        verb: str,
        pod: protocol.Pod,
        found: PodIntent,
        candidates: int,
        outcome: FilterOutcome,
    ) -> None:
        reasons = list(outcome.unresolvable.items())[:3] + list(outcome.failed.items())[:3]
        self.recent.append(
            {
                "verb": verb,
                "pod": pod.key,
                "intent": found.spec.id if found.spec else "",
                "class": found.spec.workload_class if found.spec else "",
                "error": found.error,
                "candidates": candidates,
                "kept": len(outcome.kept),
                "failed": len(outcome.failed),
                "unresolvable": len(outcome.unresolvable),
                "sample_reasons": dict(reasons),
                "at": time.time(),
            }
        )

    def state(self) -> dict[str, Any]:
        bindings = list(self.view.bindings)[-50:]
        return {
            "bind_mode": self.bind_mode,
            "api": self.api.description if self.api else None,
            "risk_threshold": self.config.risk_threshold,
            "nodes": self.view.summary(),
            "recent_decisions": list(self.recent)[-50:],
            "bindings": [vars(b) for b in bindings],
            "bindings_total": len(self.view.bindings),
        }


__all__ = ["NO_INTENT", "Extender", "FilterOutcome"]
