"""Fused explicit padding (toolchain.lower.fusion): a PAD in front of a convolution or max pool is
applied by that op, the padded tensor never planned, and every backend stays bit-exact with
TFLite, which runs the PAD; what cannot be fused exactly is left as it is."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle, assert_varied
from tests.test_control_flow import branches_taken
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from tests.test_targets import assert_qemu_matches_oracle, kernels_bound, planned
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.errors import PlanError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.check import random_inputs
from toolchain.lower.plan import NO_TECHNIQUES, Techniques, plan_model
from toolchain.lower.program import lower
from toolchain.tflm.embed import METADATA_NAME, embed_plan

ZP = -7  # the int8 input's zero point: padding with anything else would show
NO_FUSION = Techniques(fuse_padding=False)


def i32(values) -> np.ndarray:
    return np.asarray(values, np.int32)


def padded_model(consumer: str = "CONV_2D", dtype: str = "int8",
                 image: tuple[int, int, int, int] = (1, 9, 8, 5), padded_output: bool = False,
                 second_reader: bool = False, **options) -> bytes:
    """x -> PAD -> `consumer` -> output (pad_and_window); an int8 model quantizes the input with
    zero point ZP. The padded tensor is an output too with `padded_output`, and ADD reads it
    too with `second_reader`."""
    b = ModelBuilder()
    x = b.input("x", image, dtype, *((0.05, ZP) if dtype != "float32" else ()))
    out, padded = pad_and_window(b, x, consumer, dtype, image, **options)
    b.output(out)
    if padded_output:
        b.output(padded)
    if second_reader:
        doubled = b.tensor("doubled", b.shape(padded), dtype, *((0.05, ZP) if dtype != "float32"
                                                                else ()))
        b.op("ADD", [padded, padded], [doubled], {"fused_activation_function": "NONE"})
        b.output(doubled)
    return b.build()


def pad_and_window(b: ModelBuilder, x: int, consumer: str, dtype: str,
                   image: tuple[int, int, int, int], pads=((1, 2), (2, 0)), value=None,
                   opcode: str = "PAD", padding: str = "VALID", kernel=(3, 3), stride=(1, 1),
                   channels: int = 6, paddings=None, seed: int = 0) -> tuple[int, int]:
    """PAD (PADV2 with `value`) of `x` by `pads` ((top, bottom), (left, right)), or by the
    whole `paddings`, then `consumer`: its output and the padded tensor."""
    rng = np.random.default_rng(seed)
    quantized = dtype != "float32"
    q = (0.05, ZP) if quantized else ()
    batch = image[0]
    (top, bottom), (left, right) = pads
    pairs = paddings if paddings is not None else [[0, 0], [top, bottom], [left, right], [0, 0]]
    padded_shape = tuple(n + a + z for n, (a, z) in zip(image, pairs, strict=True))
    padded = b.tensor("padded", padded_shape, dtype, *q)
    inputs = [x, b.const("paddings", i32(pairs))]
    if value is not None:
        inputs.append(b.const("value", np.asarray([value], dtype), *q))
    b.op(opcode, inputs, [padded])
    _, ph, pw, pc = padded_shape

    def out_size(n, k, s):
        return -(-n // s) if padding == "SAME" else (n - k) // s + 1

    oh, ow = out_size(ph, kernel[0], stride[0]), out_size(pw, kernel[1], stride[1])
    options = {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
               "fused_activation_function": "NONE"}
    if consumer in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        depthwise = consumer == "DEPTHWISE_CONV_2D"
        channels = pc if depthwise else channels
        shape = (1, *kernel, channels) if depthwise else (channels, *kernel, pc)
        if quantized:
            w = b.const("w", rng.integers(-127, 128, shape).astype(np.int8), 0.02, 0)
            bias = b.const("b", rng.integers(-300, 300, channels).astype(np.int32), 0.001, 0)
            out = b.tensor("y", (batch, oh, ow, channels), dtype, 0.15, 3)
        else:
            w = b.const("w", rng.normal(0, 0.3, shape).astype(np.float32))
            bias = b.const("b", rng.normal(0, 0.1, channels).astype(np.float32))
            out = b.tensor("y", (batch, oh, ow, channels), dtype)
        options.update(dilation_h_factor=1, dilation_w_factor=1)
        if depthwise:
            options["depth_multiplier"] = 1
        b.op(consumer, [padded, w, bias], [out], options, 2 if quantized else 1)
    else:
        out = b.tensor("y", (batch, oh, ow, pc), dtype, *q)
        options.update(filter_height=kernel[0], filter_width=kernel[1])
        b.op(consumer, [padded], [out], options, 2 if quantized else 1)
    return out, padded


def fusions(model: bytes, target: str = "generic"):
    return lower(parse_model(model, "built.tflite"), target=target).pad_fusions


def assert_fused_and_exact(model: bytes) -> None:
    """Fused, the padded tensor has no buffer and the arena does not grow; runtime_py and the C
    match TFLite, and the fused run equals the unfused one value for value."""
    (fusion,) = fusions(model)
    assert fusion.fused, fusion.refused
    parsed = parse_model(model, "built.tflite")
    fused, plain = plan_model(parsed, "greedy"), plan_model(parsed, "greedy",
                                                            techniques=NO_FUSION)
    assert fusion.tensor not in fused.lifetimes.tensor_buffers
    assert fusion.tensor in plain.lifetimes.tensor_buffers
    assert fused.arena_bytes <= plain.arena_bytes
    assert_varied(model)
    assert_matches_oracle(model)
    values = random_inputs(fused.graph, 1)
    for a, b in zip(ArenaInterpreter(fused).invoke(values), ArenaInterpreter(plain).invoke(values),
                    strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", [
    dict(),  # PAD -> VALID CONV_2D, asymmetric pads
    dict(pads=((0, 1), (0, 1)), stride=(2, 2)),  # the stride-2 pattern converters write
    dict(pads=((1, 0), (0, 1)), padding="SAME"),  # combined with the op's own SAME padding
    dict(pads=((3, 3), (3, 3)), kernel=(7, 7), image=(1, 12, 10, 3), stride=(2, 2)),
])
def test_pad_into_conv_2d(case):
    assert_fused_and_exact(padded_model("CONV_2D", **case))


@pytest.mark.parametrize("case", [
    dict(),
    dict(pads=((1, 1), (1, 1)), stride=(2, 2), image=(2, 7, 9, 16)),
    dict(pads=((0, 2), (1, 1)), padding="SAME", kernel=(5, 3)),
])
def test_pad_into_depthwise_conv_2d(case):
    assert_fused_and_exact(padded_model("DEPTHWISE_CONV_2D", **case))


def test_padv2_with_the_zero_point_into_conv_2d():
    assert_fused_and_exact(padded_model("CONV_2D", opcode="PADV2", value=ZP))


def test_float_pad_into_conv_2d():
    assert_fused_and_exact(padded_model("CONV_2D", dtype="float32"))
    assert_fused_and_exact(padded_model("DEPTHWISE_CONV_2D", dtype="float32", opcode="PADV2",
                                        value=0.0))


@pytest.mark.parametrize("dtype, value", [("int8", -128), ("float32", -np.inf),
                                          ("float32", float(np.finfo(np.float32).min))])
def test_padv2_with_the_lowest_value_into_max_pool(dtype, value):
    assert_fused_and_exact(padded_model("MAX_POOL_2D", dtype, opcode="PADV2", value=value,
                                        pads=((1, 1), (1, 0)), kernel=(3, 2), stride=(2, 2)))


@pytest.mark.parametrize("model, reason", [
    (lambda: padded_model(opcode="PADV2", value=ZP + 1), "not the input's zero point -7"),
    (lambda: padded_model(dtype="float32", opcode="PADV2", value=0.5), "zero point 0"),
    (lambda: padded_model(second_reader=True), "3 operands read its output"),
    (lambda: padded_model(padded_output=True), "its output is a graph output"),
    (lambda: padded_model(paddings=[[0, 0], [1, 1], [0, 0], [0, 2]], channels=4),
     "another axis than height and width"),
    (lambda: padded_model("AVERAGE_POOL_2D"), "an average divides"),
    (lambda: padded_model("MAX_POOL_2D"), "can exceed the input"),  # PAD writes the zero point
    (lambda: padded_model(pads=((3, 0), (0, 0))), "padding only"),
    (lambda: padded_model(kernel=(1, 1), pads=((0, 0), (1, 0))), "padding only"),
])
def test_what_is_not_fused_stays_exact(model, reason):
    """Each is kept as TFLite runs it, says why, and still matches the oracle."""
    model = model()
    (fusion,) = fusions(model)
    assert not fusion.fused and reason in fusion.refused
    mp = plan_model(parse_model(model, "built.tflite"), "greedy")
    assert fusion.tensor in mp.lifetimes.tensor_buffers
    assert_matches_oracle(model, c=False)


def test_fusion_lowers_the_peak_a_padded_tensor_set():
    """A wide image padded for a strided convolution: input and padded tensor together are the
    peak; fused, only the input and the (small) output are, and the output may overlap the
    rows of the input it has consumed (counted from the fused padding: the C, which writes row
    by row, would read overwritten rows otherwise)."""
    data = padded_model(image=(1, 32, 32, 16), pads=((1, 1), (1, 1)), stride=(2, 2),
                        channels=4)
    model = parse_model(data, "built.tflite")
    fused, plain = (plan_model(model, techniques=t) for t in (Techniques(), NO_FUSION))
    image, padded, out = 32 * 32 * 16, 34 * 34 * 16, 16 * 16 * 4
    assert plain.lower_bound_bytes == image + padded
    assert fused.lower_bound_bytes == image + out
    assert fused.arena_bytes < image + out < plain.arena_bytes
    assert_matches_oracle(data, planner="best")


def test_embed_plans_the_pad_tflite_micro_runs(tmp_path):
    """TFLM runs the file's PAD: embed plans it unfused and refuses a fused plan."""
    data = padded_model()
    model = parse_model(data, "built.tflite")
    assert not plan_model(model, techniques=NO_TECHNIQUES).program.fused_pads
    with pytest.raises(PlanError, match="fuses PADs into the ops reading them"):
        embed_plan(data, plan_model(model))
    path, out = tmp_path / "m.tflite", tmp_path / "out.tflite"
    path.write_bytes(data)
    assert main(["embed", str(path), "-o", str(out), "--quiet"]) == 0
    (fusion,) = fusions(data)
    entries = np.frombuffer(parse_model(out.read_bytes(), "out").metadata[METADATA_NAME], "<i4")
    assert entries[3 + fusion.tensor] >= 0  # the padded tensor has its offset


def test_generated_c_names_the_fused_pad(tmp_path):
    mp = plan_model(parse_model(padded_model(), "built.tflite"), "greedy")
    c = generate(mp, "net")["net.c"]
    assert "op 0 PAD: fused into op 1 CONV_2D, which reads its input as padded */" in c
    assert "net_op0_pad(void)" not in c


def test_plan_and_inspect_say_what_was_fused(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(padded_model())
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    (fusion,) = fusions(path.read_bytes())
    assert (f"fused pads   op 0 PAD into op 1 CONV_2D: tensor {fusion.tensor} 'padded' "
            "(") in out
    assert main(["plan", str(path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["fused_pads"]
    assert row == {"subgraph": 0, "pad": 0, "pad_opcode": "PAD", "into": 1, "opcode": "CONV_2D",
                   "tensor": fusion.tensor, "name": "padded", "bytes": 600,
                   "padding": [[1, 2], [2, 0]]}
    assert main(["plan", str(path), "--no-fuse-padding"]) == 0
    assert "fused pads" not in capsys.readouterr().out
    assert main(["inspect", str(path)]) == 0
    assert "op 0 PAD: fused into op 1 CONV_2D" in capsys.readouterr().out
    path.write_bytes(padded_model("AVERAGE_POOL_2D"))
    assert main(["inspect", str(path)]) == 0
    assert "op 0 PAD: not fused into op 1 AVERAGE_POOL_2D: an average" in capsys.readouterr().out


@needs_mcu
@pytest.mark.parametrize("target, consumer, kernel, case", [
    ("cortex-m4", "CONV_2D", "dsp-im2col", dict(pads=((1, 2), (2, 0)))),
    ("cortex-m4", "CONV_2D", "dsp-rows", dict(pads=((0, 1), (0, 1)), stride=(2, 2))),
    ("cortex-m4", "CONV_2D", "dsp-rows", dict(pads=((1, 2), (2, 0)), image=(1, 9, 8, 4))),
    ("cortex-m4", "DEPTHWISE_CONV_2D", "dsp-depthwise",
     dict(pads=((2, 0), (1, 2)), image=(1, 7, 9, 6), stride=(1, 2))),
    ("cortex-m55", "CONV_2D", "mve-im2col", dict(pads=((1, 2), (2, 0)))),
    ("cortex-m55", "DEPTHWISE_CONV_2D", "mve-depthwise", dict(pads=((2, 0), (1, 2)))),
])
def test_target_kernels_pad_a_fused_pad_exactly(target, consumer, kernel, case):
    """The Arm kernels fill their windows' padding with the zero point: fused, they match
    TFLite under QEMU."""
    model = padded_model(consumer, **case)
    mp = planned(model, target)
    assert mp.program.fused_pads and kernel in kernels_bound(mp)
    assert_qemu_matches_oracle(model, target)


def if_model(values: tuple, hand_back_padded: bool = False) -> bytes:
    """IF over two branches, each x -> PADV2 (its value of `values`) -> CONV_2D, handing back
    the convolution's output (and the padded tensor too with `hand_back_padded`)."""
    image = (1, 6, 7, 3)
    b = ModelBuilder()
    branches = []
    for name, value in zip(("then", "else"), values, strict=True):
        g = b.subgraph(name)
        x = g.input("x", image, "int8", 0.05, ZP)
        out, padded = pad_and_window(g, x, "CONV_2D", "int8", image, opcode="PADV2",
                                     value=value, seed=len(branches))
        g.output(out)
        if hand_back_padded:
            g.output(padded)
        branches.append(g)
    c = b.input("c", (1,), "bool")
    x = b.input("x", image, "int8", 0.05, ZP)
    for out in b.if_(c, *branches, [x]):
        b.output(out)
    return b.build()


def test_a_pad_in_an_if_branch():
    """A branch's PAD is fused like any (the other's, padding with another value, is not);
    the IF takes both branches, bit-exact."""
    model = if_model((ZP, ZP + 2))
    assert [f.fused for f in fusions(model)] == [True, False]
    assert branches_taken(model, 6) == {True, False}
    assert_matches_oracle(model, inputs=6)


def test_a_padded_tensor_an_if_hands_back_stays():
    model = if_model((ZP, ZP), hand_back_padded=True)
    assert [f.refused for f in fusions(model)] == ["an IF or WHILE copies or tests its output"] * 2
    assert_matches_oracle(model, inputs=4)


def test_the_fused_rows_count_in_the_overlap():
    """The output grows (4 -> 16 channels): the plan puts it below the input, as far as the
    overlap rule says the row-by-row C needs. Two fused rows on top mean two more input rows
    still to read per output row: counted from the PAD's input without them, the input would
    start 64 bytes lower and the C would read rows it has overwritten."""
    data = padded_model(image=(1, 8, 8, 4), pads=((2, 0), (1, 1)), channels=16)
    mp = plan_model(parse_model(data, "built.tflite"), "optimal")
    x, y = mp.graph.inputs[0], mp.graph.outputs[0]
    offsets = mp.offset_of_tensor()
    assert offsets[x] - offsets[y] == 8 * 128 - (8 - 1 - 2) * 32  # rows 5.. still to read
    assert mp.arena_bytes == offsets[x] + 8 * 8 * 4
    assert_matches_oracle(data, planner="optimal")
