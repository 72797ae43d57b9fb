"""The few GPU operations the co-run needs, for torch and for CuPy (imported only when run).

Both give: the device's stream-priority range, streams with a priority, one batch-1 online
request (a small MLP forward, synchronised on its stream), and a batch GEMM block of a given
number of rows on a stream (asynchronous; the caller throttles with ``sync``).
"""

from __future__ import annotations

from typing import Any, Protocol


class GpuOps(Protocol):
    name: str
    version: str

    def priority_range(self) -> tuple[int, int]: ...  # (least, greatest)
    def stream(self, priority: int) -> Any: ...
    def online_request(self, stream: Any) -> None: ...
    def batch_block(self, stream: Any, rows: int) -> None: ...
    def sync(self, stream: Any) -> None: ...


class TorchOps:
    name = "torch"

    def __init__(self, device: int, hidden: int, layers: int, batch_n: int) -> None:
        import torch

        self._torch = torch
        self.version = torch.__version__
        torch.cuda.set_device(device)
        dev = torch.device("cuda", device)
        self._weights = [
            torch.randn(hidden, hidden, device=dev, dtype=torch.float16) for _ in range(layers)
        ]
        self._x = torch.randn(1, hidden, device=dev, dtype=torch.float16)
        self._a = torch.randn(batch_n, batch_n, device=dev, dtype=torch.float16)
        self._b = torch.randn(batch_n, batch_n, device=dev, dtype=torch.float16)
        torch.cuda.synchronize()

    def priority_range(self) -> tuple[int, int]:
        least, greatest = self._torch.cuda.Stream.priority_range()
        return int(least), int(greatest)

    def stream(self, priority: int) -> Any:
        return self._torch.cuda.Stream(priority=priority)

    def online_request(self, stream: Any) -> None:
        with self._torch.cuda.stream(stream):
            x = self._x
            for w in self._weights:
                x = self._torch.relu(x @ w)
        stream.synchronize()

    def batch_block(self, stream: Any, rows: int) -> None:
        with self._torch.cuda.stream(stream):
            self._a[:rows] @ self._b

    def sync(self, stream: Any) -> None:
        stream.synchronize()


class CupyOps:
    name = "cupy"

    def __init__(self, device: int, hidden: int, layers: int, batch_n: int) -> None:
        import cupy

        self._cp = cupy
        self.version = cupy.__version__
        cupy.cuda.Device(device).use()
        self._weights = [
            cupy.random.standard_normal((hidden, hidden), dtype=cupy.float32).astype(cupy.float16)
            for _ in range(layers)
        ]
        self._x = cupy.random.standard_normal((1, hidden), dtype=cupy.float32).astype(cupy.float16)
        self._a = cupy.random.standard_normal((batch_n, batch_n), dtype=cupy.float32).astype(
            cupy.float16
        )
        self._b = cupy.random.standard_normal((batch_n, batch_n), dtype=cupy.float32).astype(
            cupy.float16
        )
        cupy.cuda.Device(device).synchronize()

    def priority_range(self) -> tuple[int, int]:
        query = getattr(self._cp.cuda.runtime, "deviceGetStreamPriorityRange", None)
        if query is None:
            raise RuntimeError("this CuPy does not expose deviceGetStreamPriorityRange; use torch")
        least, greatest = query()
        return int(least), int(greatest)

    def stream(self, priority: int) -> Any:
        return self._cp.cuda.Stream(non_blocking=True, priority=priority)

    def online_request(self, stream: Any) -> None:
        with stream:
            x = self._x
            for w in self._weights:
                x = self._cp.maximum(x @ w, 0)
        stream.synchronize()

    def batch_block(self, stream: Any, rows: int) -> None:
        with stream:
            self._a[:rows] @ self._b

    def sync(self, stream: Any) -> None:
        stream.synchronize()


def load_ops(runtime: str, device: int, hidden: int, layers: int, batch_n: int) -> GpuOps:
    cls = TorchOps if runtime == "torch" else CupyOps
    return cls(device, hidden, layers, batch_n)
