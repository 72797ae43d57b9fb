"""Real CPU mixed-parallel co-run benchmark: online, batch and urgent work on the arena cores.

Everything runs in real processes started by the node agent's real backend: an open-loop
Poisson online stream, an Amdahl batch job of short GEMM items, and urgent events. Phases
compare the Kubernetes-default baseline, reference policies, two static OS knobs and
PARFusion's D-MUG reacting to measured latency every tick.
"""
