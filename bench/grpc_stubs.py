"""Python gRPC stubs of TorchServe's inference API, generated from bench/proto at run time
(grpcio-tools): for the e2e tests and bench.chaos's gRPC calls."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).parent / "proto"


def load_inference_stubs(out_dir: Path):
    """Return (inference_pb2, inference_pb2_grpc) compiled into out_dir."""
    import google.rpc
    import grpc_tools
    from grpc_tools import protoc

    includes = [
        str(PROTO_DIR),
        str(Path(grpc_tools.__file__).parent / "_proto"),
        str(Path(next(iter(google.rpc.__path__))).parents[1]),  # the folder that holds google/rpc/*.proto
    ]
    args = ["protoc", *(f"-I{p}" for p in includes), f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", "inference.proto"]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    sys.path.insert(0, str(out_dir))
    try:
        return importlib.import_module("inference_pb2"), importlib.import_module("inference_pb2_grpc")
    finally:
        sys.path.remove(str(out_dir))
