"""GPU co-run benchmark: an online batch-1 loop against batch GEMM on one idle GPU, three phases."""
