"""GPU-lane service: lanes over the GPUs NVML reports, share / priority plans, MPS/MIG previews."""
