"""Robot bridge: preemptible missions with safe-point checkpoints and urgent events via the allocator."""
