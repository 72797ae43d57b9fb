"""`python -m services.allocator`: the allocator's gRPC service (127.0.0.1:50051 by default)."""

from services.common.malloc import reexec_with_jemalloc

reexec_with_jemalloc()  # before the imports below: the same command again, on jemalloc

from services.allocator.server import main  # noqa: E402

main()
