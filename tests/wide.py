"""A wide graph to bound and time planning at scale: one input that N parallel RELUs read, and one
CONCATENATION of their outputs. Every order of the RELUs is valid, which is what made the
scheduler quadratic in the graph's width.

The file is written with the flatbuffers builder directly: ModelBuilder's object API spends
seconds on 100,000 operators, this a fraction of one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import flatbuffers
import numpy as np

from toolchain.front.builder import FILE_IDENTIFIER, SCHEMA_VERSION
from toolchain.front.schema import fb

WIDTH = 4  # float32 elements of the input and of each branch


def wide_model(branches: int) -> bytes:
    """Input x (1, WIDTH); y_i = RELU(x) for each branch; z = CONCATENATION(y_0 ... y_{n-1})
    on axis 1. Tensors: x is 0, y_i is i + 1, z is branches + 1."""
    b = flatbuffers.Builder(64 * branches + 1024)
    small = _ints(b, [1, WIDTH])
    tensors = [_tensor(b, b.CreateString("x"), small)]
    tensors += [_tensor(b, b.CreateString(f"y{i}"), small) for i in range(branches)]
    tensors.append(_tensor(b, b.CreateString("z"), _ints(b, [1, WIDTH * branches])))
    relu_inputs = _ints(b, [0])
    operators = [
        _operator(b, 0, relu_inputs, _ints(b, [i + 1])) for i in range(branches)
    ]
    fb.ConcatenationOptionsStart(b)
    fb.ConcatenationOptionsAddAxis(b, 1)
    options = fb.ConcatenationOptionsEnd(b)
    operators.append(
        _operator(
            b,
            1,
            _ints(b, range(1, branches + 1)),
            _ints(b, [branches + 1]),
            (fb.BuiltinOptions.ConcatenationOptions, options),
        )
    )
    subgraph_fields = (
        _vector(b, tensors),
        _ints(b, [0]),
        _ints(b, [branches + 1]),
        _vector(b, operators),
    )
    fb.SubGraphStart(b)
    fb.SubGraphAddTensors(b, subgraph_fields[0])
    fb.SubGraphAddInputs(b, subgraph_fields[1])
    fb.SubGraphAddOutputs(b, subgraph_fields[2])
    fb.SubGraphAddOperators(b, subgraph_fields[3])
    subgraph = fb.SubGraphEnd(b)
    codes = [_opcode(b, fb.BuiltinOperator.RELU), _opcode(b, fb.BuiltinOperator.CONCATENATION)]
    fb.BufferStart(b)
    empty = fb.BufferEnd(b)  # buffer 0: no data, by convention
    model_fields = (_vector(b, codes), _vector(b, [subgraph]), _vector(b, [empty]))
    description = b.CreateString("wide graph")
    fb.ModelStart(b)
    fb.ModelAddVersion(b, SCHEMA_VERSION)
    fb.ModelAddOperatorCodes(b, model_fields[0])
    fb.ModelAddSubgraphs(b, model_fields[1])
    fb.ModelAddBuffers(b, model_fields[2])
    fb.ModelAddDescription(b, description)
    b.Finish(fb.ModelEnd(b), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def _ints(b: flatbuffers.Builder, values) -> int:
    return b.CreateNumpyVector(np.fromiter(values, dtype=np.int32))


def _vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _tensor(b: flatbuffers.Builder, name: int, shape: int) -> int:
    fb.TensorStart(b)
    fb.TensorAddShape(b, shape)
    fb.TensorAddType(b, fb.TensorType.FLOAT32)
    fb.TensorAddBuffer(b, 0)
    fb.TensorAddName(b, name)
    return fb.TensorEnd(b)


def _operator(
    b: flatbuffers.Builder, opcode: int, inputs: int, outputs: int, options=None
) -> int:
    fb.OperatorStart(b)
    fb.OperatorAddOpcodeIndex(b, opcode)
    fb.OperatorAddInputs(b, inputs)
    fb.OperatorAddOutputs(b, outputs)
    if options is not None:
        fb.OperatorAddBuiltinOptionsType(b, options[0])
        fb.OperatorAddBuiltinOptions(b, options[1])
    return fb.OperatorEnd(b)


def _opcode(b: flatbuffers.Builder, code: int) -> int:
    fb.OperatorCodeStart(b)
    fb.OperatorCodeAddDeprecatedBuiltinCode(b, code)
    fb.OperatorCodeAddBuiltinCode(b, code)
    fb.OperatorCodeAddVersion(b, 1)
    return fb.OperatorCodeEnd(b)


def plan_wide(path: Path, time_limit: float, timeout: float) -> tuple[dict, float]:
    """`arenac plan --json --time-limit` on the model at `path` in a child process: its JSON
    and the wall seconds it took, start-up and reading included."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "toolchain.cli", "plan", str(path), "--json",
         "--time-limit", str(time_limit)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[1],
        check=False,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"arenac plan exited {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout), seconds


def wide_graph_timing(branches: int = 100_000, time_limit: float = 2.0) -> dict:
    """Seconds `arenac plan --json --time-limit` takes on a wide graph of `branches` + 1
    operators, start-up and reading included, with the figures of the plan it returned."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "wide.tflite"
        path.write_bytes(wide_model(branches))
        plan, seconds = plan_wide(path, time_limit, timeout=600)
    return {
        "operators": branches + 1,
        "time_limit_s": time_limit,
        "seconds": round(seconds, 2),
        "planner": plan["planner"],
        "arena_bytes": plan["arena_bytes"],
        "lower_bound_bytes": plan["lower_bound_bytes"],
    }
