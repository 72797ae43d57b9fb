"""`python -m services.allocator`: the allocator's gRPC service (127.0.0.1:50051 by default)."""

from services.allocator.server import main

main()
