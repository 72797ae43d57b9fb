"""The pure policy core: the intent model, validation and conversion, the formulas, D-MUG and
the policies, the predictor and placement. No gRPC, no I/O, no clock; every service that decides
(allocator, extender) and the experiments call it."""
