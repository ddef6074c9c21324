"""`arenac plan --layers`: each step's MACs, arena in use and top, scratch and weights; the
totals are the plan's arena and the firmware's weights as its linked image holds them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.test_folding import int4_model
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.lab import qemu_backend
from toolchain.lower.plan import plan_model
from toolchain.views.layers import covered, layers_data


@pytest.mark.parametrize("name", ["tiny_cnn_int8", "residual_cnn_float32", "streaming_kws_int8"])
def test_the_highest_top_is_the_arena(name):
    mp = plan_model(parse_model(EXAMPLES[name](), name))
    data = layers_data(mp)
    tops = [r["arena_high_water"] for r in data["layers"]]
    assert data["totals"]["arena_bytes"] == mp.arena_bytes
    assert 0 <= mp.arena_bytes - max(tops) < mp.plan.alignment  # rounded up to the alignment
    assert all(r["live_bytes"] <= r["arena_high_water"] for r in data["layers"])
    constants = {t.index for t in mp.graph.tensors if t.is_constant}
    read = {t for op in mp.graph.operators for t in op.inputs if t in constants}
    assert data["totals"]["weight_bytes"] <= sum(mp.graph.tensors[t].nbytes for t in read)


def test_macs_are_the_kernels():
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 10, 10, 3), "int8", 0.05, 0)
    c = b.conv_2d(x, 8, 3, stride=2, padding="SAME")
    d = b.depthwise_conv_2d(c, 3)
    b.output(b.fully_connected(b.reshape(d, (1, 5 * 5 * 8)), 4))
    rows = layers_data(plan_model(parse_model(b.build(), "m")))["layers"]
    macs = {r["opcode"]: r["macs"] for r in rows}
    assert macs["CONV_2D"] == 5 * 5 * 8 * 3 * 3 * 3
    assert macs["DEPTHWISE_CONV_2D"] == 5 * 5 * 8 * 3 * 3
    assert macs["FULLY_CONNECTED"] == 200 * 4 and macs["RESHAPE"] == 0


def test_covered_counts_shared_bytes_once():
    assert covered([(0, 10), (5, 20), (30, 40)]) == 30 and covered([]) == 0


@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
@pytest.mark.parametrize(("model", "target"), [("tiny_cnn_int8", "generic"), ("int4", "generic"),
                                               ("tiny_cnn_int8", "cortex-m4"),
                                               ("residual_cnn_int8", "cortex-m4"),
                                               ("tiny_cnn_int8", "cortex-m55")])
def test_weights_total_is_the_linked_firmwares(model, target):
    """The weights the table counts are the NAME_t<N> arrays of the linked image (portable
    kernels point at the model's constants; an int4 filter is counted packed) and the tables a
    kernel lays its filter out in (a target's kernels, striped ones among them, and the portable
    kernels' widened filters), each step's own."""
    from toolchain.lab.footprint import footprint

    data = int4_model("CONV_2D")[0] if model == "int4" else EXAMPLES[model]()
    mp = plan_model(parse_model(data, "m"), target=target)
    measured = footprint(mp)
    data = layers_data(mp)
    totals = data["totals"]
    assert totals["weight_bytes"] == measured["weights"]
    assert totals["kernel_weight_bytes"] == measured["kernel_weights"]
    if target != "generic":
        assert totals["kernel_weight_bytes"] > 0
    assert totals["arena_bytes"] == measured["arena"] and totals["state_bytes"] == measured["state"]


def test_plan_layers_command(tmp_path, capsys):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    assert main(["plan", str(path), "--layers", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in data["layers"]] == list(range(len(data["layers"])))
    assert main(["plan", str(path), "--layers"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("step  op") and f"arena {data['totals']['arena_bytes']:,} bytes" in text
    assert np.sum([r["macs"] for r in data["layers"]]) == data["totals"]["macs"]


@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
def test_measured_layers_add_up_to_the_linked_firmware(tmp_path, capsys):
    """`--measure`: each step's code is its kernel's in the linker's symbols, the instructions
    and cycles are the bench's, and the flash and RAM totals are the footprint's, held against
    the board named."""
    from toolchain.lab.bench import bench
    from toolchain.lab.firmware import build_mcu
    from toolchain.lab.footprint import measure
    from toolchain.targets import PARTS
    from toolchain.views.layers import board_limits

    mp = plan_model(parse_model(EXAMPLES["residual_cnn_int8"](), "m"), target="cortex-m4")
    measured = bench(mp)  # at -O2
    data = layers_data(mp, measured, board_limits(mp, "nucleo-l4r5zi"))
    rows, totals = data["layers"], data["totals"]
    linked = measure(build_mcu(mp, str(tmp_path), "model", "-O2"), mp)
    kernels = {k["op"]: k["bytes"] for k in linked["kernels"]}
    assert [r["code_bytes"] for r in rows] == [kernels.get(r["op_index"], 0) for r in rows]
    assert 0 < totals["code_bytes"] <= linked["code"]
    # a striped segment's steps run in one call, counted at its first step
    assert {r["step"]: r["instructions"] for r in rows if r["instructions"] is not None} == {
        s.step: s.instructions for s in measured.steps}
    assert any(r["instructions"] is None for r in rows) == bool(mp.tiling.segments)
    assert totals["instructions"] == measured.instructions
    flash, ram = totals["flash"], totals["ram"]
    assert flash["bytes"] == linked["flash"] == (flash["weights"] + flash["kernel_weights"]
                                                 + flash["code"] + flash["constants"])
    assert flash["kernel_weights"] == totals["kernel_weight_bytes"] > 0
    assert ram["arena"] == mp.arena_bytes == totals["arena_bytes"]
    assert ram["bytes"] == linked["ram"] + linked["stack"]
    assert ram["bytes"] == ram["arena"] + ram["state"] + ram["stack"] + ram["other"]
    part = PARTS["nucleo-l4r5zi"]
    assert flash["margin"] == part.flash.length - flash["bytes"]
    assert ram["margin"] == part.ram.length - ram["bytes"]
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["residual_cnn_int8"]())
    assert main(["plan", str(path), "--layers", "--measure", "--target", "cortex-m4"]) == 0
    text = capsys.readouterr().out
    assert f"flash        {flash['bytes']:,} bytes" in text and "limits       mps2-an386" in text


@pytest.mark.parametrize("args, says", [
    (["--measure"], "--measure and --board go with --layers"),
    (["--layers", "--board", "nucleo-l4r5zi"], "give --measure too"),
    (["--layers", "--measure", "--board", "nosuch"], "no board 'nosuch'"),
])
def test_measure_options_are_checked(args, says, tmp_path, capsys):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    assert main(["plan", str(path), *args]) == 2
    assert says in capsys.readouterr().err
