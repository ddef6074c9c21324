"""A model is validated once, before planning: every semantic defect a file can carry ends in
one ArenacError naming the file and the op or tensor, never a traceback or a huge allocation."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODEL_FILES, SHARED_MODELS, needs_shared_models
from toolchain.c.generate import generate
from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.front.schema import TENSOR_TYPES, fb
from toolchain.lab.check import random_inputs
from toolchain.lower.plan import plan_model
from toolchain.ops import REGISTRY, prepare_graph

SOURCE = "edited.tflite"
TINY_INT8 = EXAMPLES["tiny_cnn_int8"]()
TINY_FLOAT = EXAMPLES["tiny_cnn_float32"]()


def edited(data: bytes, edit) -> bytes:
    """`data` with one semantic change made through the generated object API."""
    model = fb.ModelT.InitFromPackedBuf(data, 0)
    edit(model.subgraphs[0], model)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def run_everything(data: bytes) -> None:
    """Every stage a command can reach: parse, plan, runtime_py, C generation."""
    mp = plan_model(parse_model(data, SOURCE), "greedy")
    ArenaInterpreter(mp).invoke(random_inputs(mp.graph, 0))
    generate(mp, "model")


def refusal(data: bytes, error_type: type = ModelError) -> str:
    with pytest.raises(error_type) as caught:
        run_everything(data)
    text = str(caught.value)
    assert caught.value.source == SOURCE and text.startswith(SOURCE + ": "), text
    assert "\n" not in text
    return text


def op_tensor(graph, op: int, input_position: int):
    return graph.tensors[graph.operators[op].inputs[input_position]]


def first_op(graph, model, opcode: str) -> int:
    code = fb.BuiltinOperator.__dict__[opcode]
    return next(i for i, op in enumerate(graph.operators)
                if max(model.operatorCodes[op.opcodeIndex].builtinCode,
                       model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) == code)


# -- quantization ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0.0, -1.0])
def test_scale_not_finite_and_positive_is_refused(scale):
    def edit(g, m):
        g.tensors[3].quantization.scale = [scale]

    text = refusal(edited(TINY_INT8, edit))
    assert "tensor 3" in text and "scale" in text


@pytest.mark.parametrize("zero_point", [1000, -129, 2**40, 2**63 - 1, -(2**63)])
def test_zero_point_outside_the_dtype_is_refused(zero_point):
    """runtime_py and the C once disagreed on these (int8 zero point 1000): both refuse now."""
    def edit(g, m):
        g.tensors[3].quantization.zeroPoint = [zero_point]

    text = refusal(edited(TINY_INT8, edit))
    assert "tensor 3" in text and f"zero point {zero_point}" in text and "[-128, 127]" in text


def per_channel_filter(g, m):
    """The first convolution's filter, quantized with one scale per output channel."""
    filt = op_tensor(g, 0, 1)
    channels = filt.shape[0]
    filt.quantization.scale = [filt.quantization.scale[0]] * channels
    filt.quantization.zeroPoint = [0] * channels
    return filt


@pytest.mark.parametrize("dimension", [4, -1])
def test_quantized_dimension_outside_the_rank_is_refused(dimension):
    def edit(g, m):
        per_channel_filter(g, m).quantization.quantizedDimension = dimension

    text = refusal(edited(TINY_INT8, edit))
    assert f"dimension {dimension}" in text and "rank 4" in text


def test_per_channel_scale_count_must_match_the_dimension():
    def edit(g, m):
        per_channel_filter(g, m).quantization.quantizedDimension = 1  # kernel height 3, 8 scales

    text = refusal(edited(TINY_INT8, edit))
    assert "8 scales for the 3 channels" in text


def test_a_bias_naming_its_filters_channel_axis_is_accepted():
    """Converters give a depthwise bias (rank 1) the filter's axis 3, as person_detect does."""
    def edit(g, m):
        bias = op_tensor(g, 1, 2)
        channels = bias.shape[0]
        bias.quantization.scale = [bias.quantization.scale[0]] * channels
        bias.quantization.zeroPoint = [0] * channels
        bias.quantization.quantizedDimension = 3

    run_everything(edited(TINY_INT8, edit))


def test_a_shift_beyond_30_bits_names_the_file_and_op():
    """Scales 10^30 apart once gave "requantization multiplier X with shift 98", no file."""
    def edit(g, m):
        op_tensor(g, 0, 0).quantization.scale = [1e30]

    text = refusal(edited(TINY_INT8, edit), UnsupportedOpError)
    assert "op 0 CONV_2D" in text and "left shift of" in text


# -- graph inputs, outputs and writers ---------------------------------------------------------


def test_graph_output_nobody_writes_is_refused():
    def edit(g, m):
        orphan = fb.TensorT()
        orphan.name, orphan.shape, orphan.type, orphan.buffer = "orphan", [1, 10], 0, 0
        g.tensors.append(orphan)
        g.outputs = [len(g.tensors) - 1]

    text = refusal(edited(TINY_FLOAT, edit))
    assert "graph output 0" in text and "'orphan'" in text and "no op writes" in text


def make_constant(tensor, model) -> None:
    count = int(np.prod(tensor.shape))
    buffer = fb.BufferT()
    buffer.data = np.zeros(count * 4, np.uint8)
    model.buffers.append(buffer)
    tensor.buffer = len(model.buffers) - 1


def test_constant_graph_input_is_refused():
    """NAME_input(i) would point into const weights, and the harness would write there."""
    text = refusal(edited(TINY_FLOAT, lambda g, m: make_constant(g.tensors[g.inputs[0]], m)))
    assert "graph input 0" in text and "a constant" in text


def test_variable_graph_input_is_refused():
    """The C's reset would zero the input the caller just wrote (a fuzzing finding)."""
    def edit(g, m):
        g.tensors[g.inputs[0]].isVariable = True

    text = refusal(edited(TINY_INT8, edit))
    assert "graph input 0" in text and "a variable" in text


@pytest.mark.parametrize("type_name", ["VARIANT", "RESOURCE"])
def test_graph_input_of_a_type_without_numbers_is_refused(type_name):
    """Random inputs for `check` could not even be drawn (a fuzzing finding)."""
    def edit(g, m):
        g.tensors[g.inputs[0]].type = fb.TensorType.__dict__[type_name]

    text = refusal(edited(TINY_INT8, edit))
    assert "graph input 0" in text and type_name.lower() in text


def test_op_writing_a_constant_is_refused():
    def edit(g, m):
        make_constant(g.tensors[g.operators[2].outputs[0]], m)

    text = refusal(edited(TINY_FLOAT, edit))
    assert "op 2 CONV_2D writes tensor" in text and "a constant" in text


def test_op_without_outputs_is_refused():
    def edit(g, m):
        g.operators[-1].outputs = []
        g.outputs = [g.operators[-2].outputs[0]]

    text = refusal(edited(TINY_FLOAT, edit))
    assert "op 8 SOFTMAX" in text and "has no outputs" in text


# -- sizes -------------------------------------------------------------------------------------


def test_tensor_of_2_31_elements_is_refused_before_any_allocation():
    """It once passed the reader; run and check then tried an 8 GiB np.full."""
    def edit(g, m):
        g.tensors[g.inputs[0]].shape = [2, 2**30]

    with pytest.raises(ModelError) as caught:
        parse_model(edited(TINY_FLOAT, edit), SOURCE, max_bytes=2**40)
    assert "tensor 0" in str(caught.value) and "32-bit index" in str(caught.value)


def test_tensor_over_the_byte_limit_is_refused():
    def edit(g, m):
        g.tensors[g.inputs[0]].shape = [1, 2**27 + 16]  # 64 bytes over 512 MiB of float32

    text = refusal(edited(TINY_FLOAT, edit))
    assert "tensor 0" in text and "over the limit of 536870912" in text


def test_activations_together_over_the_limit_are_refused():
    """tiny_cnn_float32: a 16224-byte file whose non-constant tensors take 20048 bytes, none
    more than 9216."""
    parse_model(TINY_FLOAT, SOURCE, max_bytes=20048)
    with pytest.raises(ModelError) as caught:
        parse_model(TINY_FLOAT, SOURCE, max_bytes=20047)
    assert str(caught.value) == (
        f"{SOURCE}: activations and state total 20048 bytes, over the limit of 20047")


def test_file_over_the_limit_is_not_parsed():
    with pytest.raises(ModelError) as caught:
        parse_model(TINY_FLOAT, SOURCE, max_bytes=1000)
    assert "larger than the limit of 1000 bytes" in str(caught.value)


# -- per-op checks (prepare) -------------------------------------------------------------------


@pytest.mark.parametrize("inputs", [[None, -1, None], [None]], ids=["absent", "missing"])
def test_fully_connected_without_weights_is_refused(inputs):
    def edit(g, m):
        op = g.operators[first_op(g, m, "FULLY_CONNECTED")]
        op.inputs = [op.inputs[i] if v is None else v for i, v in enumerate(inputs)]

    text = refusal(edited(TINY_INT8, edit))
    assert "op 7 FULLY_CONNECTED" in text and "weights (input 1) is missing" in text


@pytest.mark.parametrize("opcode", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
def test_pooling_without_options_is_refused(opcode):
    def edit(g, m):
        op = g.operators[first_op(g, m, opcode)]
        op.builtinOptions, op.builtinOptionsType = None, 0

    text = refusal(edited(TINY_FLOAT, edit))
    assert opcode in text and "options lack" in text


@pytest.mark.parametrize("data", [TINY_FLOAT, TINY_INT8], ids=["float32", "int8"])
def test_channel_dimension_of_0_is_refused(data):
    def edit(g, m):
        g.tensors[g.inputs[0]].shape = [1, 16, 16, 0]

    text = refusal(edited(data, edit), UnsupportedOpError)
    assert "op 0 CONV_2D" in text and "empty input" in text


@pytest.mark.parametrize("option, value", [
    ("dilationHFactor", 2**31 - 1), ("dilationWFactor", 2**31 - 1), ("strideH", 2**31 - 1)])
def test_window_reaching_beyond_int32_is_refused(option, value):
    """A dilation of 2^31 - 1 was accepted and overflowed the generated C's int indices."""
    def edit(g, m):
        setattr(g.operators[0].builtinOptions, option, value)

    text = refusal(edited(TINY_FLOAT, edit), UnsupportedOpError)
    assert "op 0 CONV_2D" in text and "32-bit indices" in text


def test_dilation_needing_a_huge_plane_is_refused():
    def edit(g, m):
        g.operators[0].builtinOptions.dilationHFactor = 20_000
        g.operators[0].builtinOptions.dilationWFactor = 20_000

    text = refusal(edited(TINY_FLOAT, edit), UnsupportedOpError)
    assert "op 0 CONV_2D" in text and "padded plane" in text


@pytest.mark.parametrize("option", ["strideH", "dilationWFactor"])
def test_window_stride_or_dilation_of_0_is_refused(option):
    def edit(g, m):
        setattr(g.operators[0].builtinOptions, option, 0)

    text = refusal(edited(TINY_FLOAT, edit))
    assert "op 0 CONV_2D" in text and "must be positive" in text


def test_pooling_window_with_absurd_work_is_refused():
    def edit(g, m):
        options = g.operators[first_op(g, m, "MAX_POOL_2D")].builtinOptions
        options.filterHeight = options.filterWidth = 3000
        options.padding = fb.Padding.SAME

    text = refusal(edited(TINY_FLOAT, edit), UnsupportedOpError)
    assert "MAX_POOL_2D" in text and "taps" in text


def batch_matmul(lhs_shape, rhs_shape, out_shape, extra_inputs=0) -> bytes:
    b = ModelBuilder("float32")
    lhs = b.input("lhs", lhs_shape, "float32")
    rhs = b.const("rhs", np.ones(rhs_shape, np.float32))
    out = b.tensor("out", out_shape, "float32")
    b.op("BATCH_MATMUL", [lhs, rhs, *[rhs] * extra_inputs][:2 + extra_inputs], [out])
    b.output(out)
    return b.build()


@pytest.mark.parametrize("lhs, rhs, out", [
    ((3,), (3, 2), (2,)), ((2, 3), (4, 2), (2, 2)), ((2, 3), (3, 2), (2, 3))])
def test_batch_matmul_of_wrong_rank_or_dims_is_refused(lhs, rhs, out):
    text = refusal(batch_matmul(lhs, rhs, out), UnsupportedOpError)
    assert "op 0 BATCH_MATMUL" in text


def test_batch_matmul_with_three_inputs_is_refused():
    """An op recoded from FULLY_CONNECTED (input, weights, bias) once failed to unpack."""
    text = refusal(batch_matmul((2, 3), (3, 2), (2, 2), extra_inputs=1), UnsupportedOpError)
    assert "op 0 BATCH_MATMUL: no kernel for float32, float32, float32 -> float32" in text


def test_uint32_constant_reaching_a_kernel_is_refused():
    """uint32 is stored (the audio front end's energies), but no FULLY_CONNECTED runs it."""
    def edit(g, m):
        op_tensor(g, 7, 1).type = TENSOR_TYPES["uint32"]  # the FULLY_CONNECTED weights

    text = refusal(edited(TINY_FLOAT, edit), UnsupportedOpError)
    assert "op 7 FULLY_CONNECTED: no kernel for float32, uint32, float32 -> float32" in text


def test_graph_input_no_backend_can_hold_is_refused():
    """An extra string input that no op reads once reached numpy's dtype() in runtime_py."""
    def edit(g, m):
        extra = fb.TensorT()
        extra.name, extra.shape, extra.type, extra.buffer = "text", [4], TENSOR_TYPES["string"], 0
        g.tensors.append(extra)
        g.inputs = [*g.inputs, len(g.tensors) - 1]

    text = refusal(edited(TINY_FLOAT, edit))
    assert "graph input 1 is tensor 21 ('text') of type string" in text


def test_an_unexpected_failure_in_prepare_still_names_the_op(monkeypatch):
    """The last line of defense: a check a prepare lacks becomes one line, not a traceback."""
    def broken(graph, op):
        return {}[op.index]

    spec = REGISTRY["SOFTMAX"]
    monkeypatch.setitem(REGISTRY, "SOFTMAX", dataclasses.replace(spec, prepare=broken))
    model = parse_model(TINY_FLOAT, SOURCE)
    with pytest.raises(UnsupportedOpError) as caught:
        prepare_graph(model.main, SOURCE)
    assert str(caught.value) == (
        f"{SOURCE}: unsupported: op 8 SOFTMAX: cannot prepare (KeyError: 8)")


def test_an_invalid_op_is_a_model_error_naming_it():
    def edit(g, m):
        g.operators[7].inputs = [g.operators[7].inputs[0]]

    with pytest.raises(ModelError) as caught:
        prepare_graph(parse_model(edited(TINY_FLOAT, edit), SOURCE).main, SOURCE)
    assert str(caught.value) == (
        f"{SOURCE}: invalid: op 7 FULLY_CONNECTED: the required weights (input 1) is missing")


# -- the command line --------------------------------------------------------------------------


CLI_CASES = {
    "nan-scale": (TINY_INT8, lambda g, m: setattr(g.tensors[3].quantization, "scale", [np.nan])),
    "zero-point-2-40": (TINY_INT8,
                        lambda g, m: setattr(g.tensors[3].quantization, "zeroPoint", [2**40])),
    "constant-input": (TINY_FLOAT, lambda g, m: make_constant(g.tensors[g.inputs[0]], m)),
    "no-weights": (TINY_INT8, lambda g, m: setattr(g.operators[7], "inputs",
                                                   [g.operators[7].inputs[0], -1])),
    "huge-dilation": (TINY_FLOAT, lambda g, m: setattr(g.operators[0].builtinOptions,
                                                       "dilationHFactor", 2**31 - 1)),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_gen_refuses_in_one_line(tmp_path, case):
    data, edit = CLI_CASES[case]
    path = tmp_path / f"{case}.tflite"
    path.write_bytes(edited(data, edit))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "toolchain.cli", "gen", str(path), "-o",
                             str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not out.exists()


# -- real models -------------------------------------------------------------------------------


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_every_shared_model_still_parses_plans_and_prepares(path):
    model = parse_model(path.read_bytes(), path.name)
    mp = plan_model(model, "greedy")
    assert len(prepare_graph(mp.graph, path.name)) == len(mp.graph.operators)


@needs_shared_models
def test_recurrent_shared_models_still_parse():
    """Variables with and without initial values are state, neither constants nor orphans."""
    paths = sorted((SHARED_MODELS / "recurrent").glob("*.tflite"))
    if not paths:
        pytest.skip("no recurrent reference models")
    for path in paths:
        graph = parse_model(path.read_bytes(), path.name).main
        assert graph.operators and any(t.is_variable for t in graph.tensors)
