"""The committed generated code matches proto/, and the service has exactly the eight RPCs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ale.env.v1 import env_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ["env_pb2.py", "env_pb2_grpc.py", "env_pb2.pyi"]


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "proto"),
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(ROOT / "proto/ale/env/v1/env.proto"),
        ],
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "ale/env/v1" / name).read_bytes()
        committed = (ROOT / "ale/env/v1" / name).read_bytes()
        assert fresh == committed, f"ale/env/v1/{name} is stale: run `make proto`"


def test_service_has_exactly_the_eight_unary_rpcs() -> None:
    service = pb.DESCRIPTOR.services_by_name["AleEnv"]
    assert service.full_name == "ale.env.v1.AleEnv"
    assert [m.name for m in service.methods] == [
        "CreateEnv",
        "GetSpec",
        "Reset",
        "Step",
        "StartEvalSession",
        "GetEvalResult",
        "SubmitBatchEval",
        "GetBatchEvalStatus",
    ]
    for method in service.methods:
        assert not method.client_streaming, method.name
        assert not method.server_streaming, method.name
