"""Container / launcher health probe: `python -m parfusion.healthcheck grpc HOST:PORT | http URL`."""

from __future__ import annotations

import sys
import urllib.request


def check_grpc(address: str, timeout: float = 2.0) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def check_http(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback probe
            return bool(resp.status == 200)
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in {"grpc", "http"}:
        sys.stderr.write("usage: python -m parfusion.healthcheck grpc HOST:PORT | http URL\n")
        return 2
    ok = check_grpc(args[1]) if args[0] == "grpc" else check_http(args[1])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
