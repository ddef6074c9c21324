"""The convolution kernels on the real models in ../shared/models.

Per layer: LiteRT keeps every intermediate tensor, each CONV_2D / DEPTHWISE_CONV_2D gets the
oracle's own input tensor, and its output must equal the oracle's bit for bit. This tests the
kernels on real weights and activations independently of the other op families.
"""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest

from runtime_py.kernels import KERNELS
from tests.conftest import SHARED_MODELS, needs_shared_models
from tests.opcheck import assert_matches_oracle
from toolchain.front.builder import FILE_IDENTIFIER
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.ir import Graph
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.ops import REGISTRY

pytestmark = needs_shared_models

CONV_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV")
CONV_MODELS = [
    "vww_96_int8",
    "person_detect",
    "kws_ref_model",
    "micro_speech_quantized",
    "pretrainedResnet_quant",
]


def for_litert(model: bytes) -> bytes:
    """The model with quantized_dimension 0 on 1-D tensors: person_detect's biases carry 3
    (TFLM's convention), which LiteRT refuses although no kernel reads it."""
    tree = fb.ModelT.InitFromPackedBuf(model, 0)
    for subgraph in tree.subgraphs:
        for tensor in subgraph.tensors:
            if tensor.quantization is not None and len(tensor.shape) == 1:
                tensor.quantization.quantizedDimension = 0
    builder = flatbuffers.Builder(len(model))
    builder.Finish(tree.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def per_layer_mismatches(graph: Graph, oracle: LiteRTOracle) -> list[str]:
    """Run every convolution of `graph` on the oracle's tensors; describe the differences."""
    problems = []
    for op in graph.operators:
        if op.opcode not in CONV_OPS:
            continue
        params = REGISTRY[op.opcode].prepare(graph, op)
        inputs = [
            None
            if t < 0
            else graph.tensors[t].data
            if graph.tensors[t].is_constant
            else oracle.tensor(t)
            for t in op.inputs
        ]
        expected = oracle.tensor(op.outputs[0])
        actual = np.empty_like(expected)
        KERNELS[op.opcode](params, inputs, [actual])
        differing = np.count_nonzero(actual != expected)
        if differing:
            problems.append(f"op {op.index} {op.opcode}: {differing} of {actual.size} differ")
    return problems


@pytest.mark.parametrize("name", CONV_MODELS)
def test_conv_layers_match_litert(name):
    model = (SHARED_MODELS / f"{name}.tflite").read_bytes()
    graph = parse_model(model, name).main
    oracle = LiteRTOracle(for_litert(model), preserve_all_tensors=True)
    for seed in range(2):
        oracle.invoke(random_inputs(graph, seed))
        assert not per_layer_mismatches(graph, oracle)


@pytest.mark.parametrize("name", CONV_MODELS)
def test_whole_model_matches_oracle(name):
    """End to end through the arena, once every op family of the model runs."""
    model = (SHARED_MODELS / f"{name}.tflite").read_bytes()
    assert_matches_oracle(model, inputs=2)
