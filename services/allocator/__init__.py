"""Allocator: intent store, predictor, D-MUG and the reference/ablation policies, the node loop."""
