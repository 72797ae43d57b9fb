"""The pure policy core: the intent model, validation and conversion, the formulas, D-MUG and
the policies, the cross-layer step, the predictor and placement, and ``tick.plan_tick``, the one
tick every caller runs. No gRPC, no I/O, no clock, no process-wide state."""
