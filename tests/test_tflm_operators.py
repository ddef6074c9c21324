"""Every operator TensorFlow Lite Micro's resolver registers has a kernel here (the list is
data, toolchain/tflm/resolver.txt, with its source), except the Ethos-U NPU's, refused by name;
`arenac inspect --ops` lists them all."""

from __future__ import annotations

import json

import numpy as np

from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.ops import OUT_OF_SCOPE, REGISTRY, unsupported_ops
from toolchain.tflm.resolver import tflm_operators


def test_every_operator_tflite_micro_registers_has_a_kernel_here():
    entries = tflm_operators()
    assert len(entries) == 118 and len({e.method for e in entries}) == len(entries)
    missing = [e.method for e in entries if e.operator not in REGISTRY
               and e.operator not in OUT_OF_SCOPE]
    assert not missing, f"TFLite Micro registers operators with no kernel here: {missing}"
    assert set(OUT_OF_SCOPE) <= {e.operator for e in entries}


def test_the_npu_operator_is_refused_by_name():
    b = ModelBuilder()
    x = b.input("x", (1, 16), "int8", 0.1, 0)
    y = b.tensor("y", (1, 16), "int8", 0.1, 0)
    b.custom("ethos-u", [x, b.const("command_stream", np.zeros(32, np.uint8))], [y])
    b.output(y)
    (reason,) = unsupported_ops(parse_model(b.build(), "npu.tflite").main).values()
    assert "Ethos-U NPU" in reason and "out of scope" in reason


def test_inspect_ops_lists_every_tflite_micro_operator(capsys):
    assert main(["inspect", "--ops", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_op = {row["op"]: row for row in rows}
    for entry in tflm_operators():
        row = by_op[entry.operator]
        assert row["tflm"] == entry.method
        assert row["kernels"] and row["targets"] or entry.operator in OUT_OF_SCOPE
    assert "int8, int8, int32? -> int8" in by_op["CONV_2D"]["kernels"]
    assert main(["inspect", "--ops"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| op | TFLite Micro |") and "| ethos-u | `AddEthosU` |" in table


def test_inspect_needs_a_model_or_ops(capsys):
    assert main(["inspect"]) == 2
    assert "--ops" in capsys.readouterr().err
