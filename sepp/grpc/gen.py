"""Regenerate sepp/grpc/v1/queue_pb2.py (and .pyi) from proto/sepp/v1/queue.proto.

    python -m sepp.grpc.gen            # rewrite the checked-in files
    python -m sepp.grpc.gen --check    # exit 1 if they differ from a fresh generation

The generated code is checked in (an install needs no protoc); this needs
grpcio-tools (the `dev` extra). Only the messages are generated: the service's
handlers are registered by hand in front.py, so there is no queue_pb2_grpc.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE / "proto"
PROTO_FILE = "sepp/v1/queue.proto"
OUT_DIR = HERE / "v1"
GENERATED = ("queue_pb2.py", "queue_pb2.pyi")


def generate(into: Path) -> None:
    """protoc (grpcio-tools' bundled one) over PROTO_FILE; the files land in `into`."""
    import grpc_tools
    from grpc_tools import protoc

    includes = Path(grpc_tools.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        code = protoc.main(
            [
                "protoc",
                f"-I{PROTO_ROOT}",
                f"-I{includes}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                PROTO_FILE,
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed ({code}) on {PROTO_ROOT / PROTO_FILE}")
        for name in GENERATED:
            (into / name).write_bytes((Path(tmp) / "sepp" / "v1" / name).read_bytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sepp.grpc.gen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    if not args.check:
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            name
            for name in GENERATED
            if (Path(tmp) / name).read_bytes() != (OUT_DIR / name).read_bytes()
        ]
    if stale:
        print(f"stale generated code: {', '.join(stale)} (run python -m sepp.grpc.gen)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
