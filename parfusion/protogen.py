"""`make proto`: regenerate parfusion/v1 stubs (+ .pyi) from proto/ with grpcio-tools.

`--check` regenerates into a temporary folder and fails when the committed stubs differ.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"


def generate(out: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(
        str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "parfusion" / "v1").glob("*.proto")
    )
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out / "parfusion" / "v1").glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="fail if the committed stubs are stale"
    )
    ns = parser.parse_args(argv)
    target = ROOT / "parfusion" / "v1"
    if not ns.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [
            p.name
            for p in fresh
            if not (target / p.name).exists() or not filecmp.cmp(p, target / p.name, shallow=False)
        ]
        fresh_names = {p.name for p in fresh}
        extra = [p.name for p in target.glob("*_pb2*.py*") if p.name not in fresh_names]
    if stale or extra:
        sys.stderr.write(f"generated stubs are stale: {sorted(stale + extra)}; run `make proto`\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
