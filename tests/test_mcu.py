"""The generated C on a Cortex-M4 under QEMU (mps2-an386): same outputs as runtime_py, and a
footprint of the arena, the state and little else.

Needs arm-none-eabi-gcc/size/nm/objdump (with newlib-nano) and qemu-system-arm. Without them the
tests skip, unless the environment variable CI is set: there they must be installed, so the
tests fail instead.
"""

from __future__ import annotations

import os
import struct
import tempfile

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODEL_FILES, needs_shared_models
from tests.ops.test_signal import front_end
from toolchain.errors import RuntimeBackendError
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lab import qemu_backend
from toolchain.lab.check import difference, random_inputs
from toolchain.lab.firmware import FLASH, INPUT_FILE, RAM, build_mcu, mcu_sources, tool_complaint
from toolchain.lab.footprint import footprint, footprint_table, kernel_table
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import ModelPlan, plan_model
from toolchain.ops.spec import LITERT_REF

RAM_SLACK = 2048  # bytes of .data + .bss allowed besides the arena and the state
MOVE_ONLY = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS")  # no code when output lies over input
TFLM_ARENA = 2 << 20  # room enough for TFLM to allocate any reference model (default is less)


@pytest.fixture
def mcu_tools():
    """Skip without the cross toolchain or QEMU; in CI (CI set) their absence is a failure."""
    absent = qemu_backend.missing()
    if absent:
        message = (
            f"not on PATH: {', '.join(absent)} (Debian: gcc-arm-none-eabi, "
            "libnewlib-arm-none-eabi, binutils-arm-none-eabi, qemu-system-arm)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so the MCU tests must run")
        pytest.skip(message)


needs_mcu = pytest.mark.usefixtures("mcu_tools")


def example_plan(name: str, **options) -> ModelPlan:
    return plan_model(parse_model(EXAMPLES[name](), f"{name}.tflite"), "greedy", **options)


def is_float(mp: ModelPlan) -> bool:
    return any(mp.graph.tensors[t].dtype == "float32" for t in mp.graph.outputs)


def assert_same_as_runtime_py(mp: ModelPlan, input_sets, actual) -> None:
    """Quantized outputs identical; float outputs within check's tolerance (newlib's expf and
    glibc's differ in the last bits, so float softmax outputs are not bit-identical)."""
    runtime = ArenaInterpreter(mp)
    assert len(actual) == len(input_sets)
    for values, got in zip(input_sets, actual, strict=True):
        for want, have in zip(runtime.invoke(values), got, strict=True):
            assert have.shape == want.shape and have.dtype == want.dtype
            if want.dtype.kind == "f":
                assert difference(want, have).mismatches == 0
            else:
                np.testing.assert_array_equal(have, want)


@needs_mcu
@pytest.mark.parametrize(
    "name", ["tiny_cnn_int8", "residual_cnn_int8", "tiny_cnn_float32", "residual_cnn_float32",
             "tiny_cnn_uint8", "tiny_cnn_int16"]
)
def test_built_models_match_runtime_py(name):
    mp = example_plan(name)
    input_sets = [random_inputs(mp.graph, seed) for seed in range(3)]
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
        figures = backend.footprint()
    assert_same_as_runtime_py(mp, input_sets, actual)
    assert figures["arena"] == mp.arena_bytes
    assert figures["ram"] <= figures["arena"] + figures["state"] + RAM_SLACK
    assert figures["stack_measured"] <= figures["stack"] and not figures["stack_unknown"]


@needs_mcu
@pytest.mark.parametrize("planner", ["naive", "freelist"])
def test_any_plan_runs(planner):
    mp = plan_model(parse_model(EXAMPLES["tiny_cnn_int8"](), "t.tflite"), planner)
    values = random_inputs(mp.graph, 7)
    with QemuBackend(mp) as backend:
        assert_same_as_runtime_py(mp, [values], [backend.invoke(values)])


@needs_mcu
def test_external_io_plan_runs():
    """A plan made with external_io=True: the harness owns the input and output buffers."""
    mp = example_plan("residual_cnn_int8", external_io=True)
    input_sets = [random_inputs(mp.graph, seed) for seed in range(2)]
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
        figures = backend.footprint()
    reference = example_plan("residual_cnn_int8")
    assert_same_as_runtime_py(reference, input_sets, actual)
    io_bytes = sum(mp.graph.tensors[t].nbytes for t in (*mp.graph.inputs, *mp.graph.outputs))
    assert figures["ram"] <= figures["arena"] + io_bytes + RAM_SLACK


@needs_mcu
@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_shared_models_match_runtime_py_and_beat_tflm(path):
    from toolchain.lab.oracle import TFLMOracle

    mp = plan_model(read_model(path), "greedy")
    values = random_inputs(mp.graph, 0)
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many([values])
        figures = backend.footprint()
    assert backend.seconds is not None  # the run was timed (make bench reports the figures)
    assert_same_as_runtime_py(mp, [values], actual)
    oracle = TFLMOracle(path.read_bytes(), len(mp.graph.outputs), arena_size=TFLM_ARENA)
    tflm = oracle.allocations()["total"]
    assert figures["ram"] <= figures["arena"] + figures["state"] + RAM_SLACK
    assert figures["ram"] < tflm
    assert figures["arena"] == mp.arena_bytes
    assert figures["stack_measured"] <= figures["stack"] and not figures["stack_unknown"]
    assert figures["weights"] + figures["code"] <= figures["flash"]
    # every kernel keeps its own function, but a move the plan made in place compiles to nothing
    assert all(k["present"] or k["opcode"] in MOVE_ONLY for k in figures["kernels"])


@needs_mcu
def test_footprint_is_plain_data_and_prints():
    mp = example_plan("residual_cnn_int8")
    figures = footprint(mp)
    assert figures["arena"] == mp.arena_bytes and figures["state"] == 0
    assert figures["flash"] == sum(
        figures["sections"].get(s, 0) for s in (".text", ".rodata", ".ARM.extab", ".ARM.exidx")
    ) + figures["sections"].get(".data", 0)
    assert figures["ram"] == figures["sections"].get(".data", 0) + figures["sections"][".bss"]
    assert figures["weights"] >= sum(t.nbytes for t in mp.graph.tensors if t.is_constant) // 2
    kernels = figures["kernels"]
    assert [k["op"] for k in kernels] == list(mp.lifetimes.order)
    assert sum(k["bytes"] for k in kernels) <= figures["code"]
    path = [step["function"] for step in figures["stack_path"]]
    assert path[:3] == ["Reset_Handler", "main", "model_invoke"]
    assert figures["stack"] == sum(step["bytes"] for step in figures["stack_path"])
    assert set(figures["objects"]) == {"model.o", "model_mcu.o", "startup.o"}
    text = footprint_table([figures])
    assert "residual_cnn_int8" in text and str(figures["flash"]) in text
    assert "model_op0_conv_2d" in kernel_table(figures)


@needs_mcu
@pytest.mark.parametrize("target", ["generic", "cortex-m4", "cortex-m55"])
def test_footprint_counts_the_weights_on_every_target(target):
    """Every filter is in flash in some form: the model's array, or the kernel's own copy."""
    mp = plan_model(parse_model(EXAMPLES["residual_cnn_int8"](), "residual_cnn_int8.tflite"),
                    target=target)
    figures = footprint(mp)
    filters = sum(mp.graph.tensors[op.inputs[1]].nbytes for op in mp.graph.operators
                  if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"))
    assert figures["weights"] + figures["kernel_weights"] >= filters > 0
    if target != "generic":  # the DSP and Helium kernels keep filters widened or interleaved
        assert figures["kernel_weights"] > 0
    assert figures["constants"] == (figures["flash"] - figures["weights"]
                                    - figures["kernel_weights"] - figures["code"])


def test_mcu_sources_are_deterministic_and_use_the_board_map():
    mp = example_plan("tiny_cnn_int8")
    files = mcu_sources(mp, "net")
    assert files == mcu_sources(example_plan("tiny_cnn_int8"), "net")
    assert set(files) == {"net.h", "net.c", "net_mcu.c", "startup.c", "link.ld", "semihosting.h"}
    link = files["link.ld"]
    assert f"ORIGIN = 0x{FLASH.origin:08x}, LENGTH = {FLASH.length}" in link
    assert f"ORIGIN = 0x{RAM.origin:08x}, LENGTH = {RAM.length}" in link
    assert "0xE000ED88" in files["startup.c"]  # CPACR: the FPU is enabled before main


@needs_mcu
def test_short_input_file_is_a_clear_error():
    mp = example_plan("tiny_cnn_int8")
    with QemuBackend(mp) as backend:
        run_dir = tempfile.mkdtemp(dir=backend.directory)
        with open(os.path.join(run_dir, INPUT_FILE), "wb") as f:
            f.write(struct.pack("<I", 2) + bytes(mp.graph.tensors[mp.graph.inputs[0]].nbytes))
        with pytest.raises(RuntimeBackendError, match="exit 2, input file too short.*ends early"):
            backend._run(run_dir)
        with pytest.raises(RuntimeBackendError, match="expected 768 bytes, got 3"):
            backend.invoke([np.zeros(3, np.int8)])


@needs_mcu
def test_a_firmware_that_overflows_flash_says_by_how_much(tmp_path):
    """The linker's own line, not the driver's `collect2: error: ld returned 1`."""
    mp = example_plan("tiny_cnn_int8")
    files = mcu_sources(mp, "net")
    files["link.ld"] = files["link.ld"].replace(
        f"ORIGIN = 0x{FLASH.origin:08x}, LENGTH = {FLASH.length}",
        f"ORIGIN = 0x{FLASH.origin:08x}, LENGTH = 1024")
    with pytest.raises(RuntimeBackendError, match=r"region .FLASH. overflowed by \d+ bytes"):
        build_mcu(mp, str(tmp_path), "net", files=files)


def test_a_failed_tool_names_its_own_complaint():
    stderr = ("ld: net.elf section `.text' will not fit in region `FLASH'\n"
              "ld: region `FLASH' overflowed by 1002712 bytes\n"
              "collect2: error: ld returned 1 exit status\n")
    assert tool_complaint(stderr) == "ld: region `FLASH' overflowed by 1002712 bytes"
    assert tool_complaint("x.c:3:1: error: expected ';'\n") == "x.c:3:1: error: expected ';'"
    assert tool_complaint("collect2: error: ld returned 1 exit status") == \
        "collect2: error: ld returned 1 exit status"
    assert tool_complaint("") == "no message"


def test_missing_tools_are_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert not qemu_backend.available()
    with pytest.raises(RuntimeBackendError, match="arm-none-eabi-gcc is not on PATH"):
        QemuBackend(example_plan("tiny_cnn_int8"))
    with pytest.raises(RuntimeBackendError, match="arm-none-eabi-gcc is not on PATH"):
        footprint(example_plan("tiny_cnn_int8"))


@needs_mcu
def test_footprint_command(example_path, capsys):
    from toolchain.lab.footprint import main

    path = example_path("tiny_cnn_int8")
    assert main([str(path), "--kernels"]) == 0
    out = capsys.readouterr().out
    assert "tiny_cnn_int8" in out and "stack path Reset_Handler" in out and "CONV_2D" in out
    assert main([str(path.with_name("absent.tflite"))]) == 2


@needs_mcu
def test_an_int16_model_matches_runtime_py():
    """16x8 on the Cortex-M4: int16 activations, int8 weights, int64 bias and accumulator."""
    from tests.ops.test_fully_connected import int16_fully_connected_model

    data = int16_fully_connected_model((3, 40), 7, "RELU", seed=2)
    mp = plan_model(parse_model(data, "int16.tflite"), "greedy")
    input_sets = [random_inputs(mp.graph, seed) for seed in range(3)]
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
    assert_same_as_runtime_py(mp, input_sets, actual)
    assert len(np.unique(actual[0][0])) > 8


@needs_mcu
def test_a_hybrid_model_matches_runtime_py():
    """Dynamic range on the Cortex-M4: float32 rows quantized as they are read, int8 weights."""
    from tests.ops.test_fully_connected import hybrid_fully_connected_model

    data = hybrid_fully_connected_model((3, 40), 7, "RELU", asymmetric=True, seed=2)
    mp = plan_model(parse_model(data, "hybrid.tflite"), "greedy")
    input_sets = [random_inputs(mp.graph, seed) for seed in range(3)]
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
    assert_same_as_runtime_py(mp, input_sets, actual)


@needs_mcu
def test_a_kernel_whose_output_lies_below_its_input_runs():
    """int8 -> int16 SOFTMAX with its output planned below its input: GCC 12 once deleted the
    kernel's call at -Os (an arena store rewritten from address 0, taken for a null store)."""
    b = ModelBuilder("int8")
    x = b.input("x", (1, 10), "int8", 0.05, 3)
    y = b.tensor("y", (1, 10), "int16", 1.0 / 65536, -32768)
    b.op("SOFTMAX", [x], [y], {"beta": 1.0})
    b.output(y)
    mp = plan_model(parse_model(b.build(), "softmax.tflite"), "optimal")
    offsets = mp.offset_of_tensor()
    assert offsets[y] < offsets[x]
    input_sets = [random_inputs(mp.graph, seed) for seed in range(2)]
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
    assert_same_as_runtime_py(mp, input_sets, actual)


@needs_mcu
@pytest.mark.parametrize("state", ["int16", "int8"])
def test_a_recurrent_model_keeps_its_state_across_invokes(state):
    """SVDF on the Cortex-M4: five invokes in one run, the state (also an output) carried from
    each to the next as runtime_py carries it."""
    from tests.ops.test_svdf import svdf_model

    mp = plan_model(parse_model(svdf_model(state, seed=3), "svdf.tflite"), "greedy")
    input_sets = [random_inputs(mp.graph, seed) for seed in range(5)]
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
    runtime = ArenaInterpreter(mp)
    expected = [runtime.invoke(values) for values in input_sets]
    for want, have in zip(expected, actual, strict=True):
        for w, h in zip(want, have, strict=True):
            np.testing.assert_array_equal(h, w)
    assert not np.array_equal(actual[0][1], actual[4][1])  # the state moved


@needs_mcu
def test_a_hybrid_svdf_keeps_its_state_bit_for_bit():
    """Hybrid SVDF (int8 weights, float input and state) on the Cortex-M4: the input rows
    quantized in the firmware's single-precision float, five invokes bit-exact with LiteRT."""
    from tests.ops.test_svdf import float_svdf_model, oracle_sequence

    model = float_svdf_model(hybrid=True, asymmetric=True, batches=2, input_size=21, filters=9,
                             memory=7, rank=3)
    mp = plan_model(parse_model(model, "svdf.tflite"), "greedy")
    input_sets = [random_inputs(mp.graph, seed) for seed in range(5)]
    expected = oracle_sequence(model, input_sets, LITERT_REF, len(mp.graph.outputs))
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
    for want, have in zip(expected, actual, strict=True):
        for w, h in zip(want, have, strict=True):
            assert w.tobytes() == h.tobytes()


@needs_mcu
def test_an_audio_front_end_matches_runtime_py_over_a_sequence():
    """TFLite Micro's signal ops from raw audio to features on the Cortex-M4: the noise estimate
    carries from invoke to invoke (runtime_py keeps it alike), and the kernels' state lies in
    the state block, beside the arena."""
    mp = plan_model(parse_model(front_end(frame=64, fft_length=64, channels=8), "fe.tflite"))
    input_sets = [random_inputs(mp.graph, seed) for seed in range(4)]
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(input_sets)
        figures = backend.footprint()
    runtime = ArenaInterpreter(mp)
    for values, got in zip(input_sets, actual, strict=True):
        for want, have in zip(runtime.invoke(values), got, strict=True):
            np.testing.assert_array_equal(have, want)
    assert figures["state"] == mp.state_bytes > 0
    assert figures["ram"] <= figures["arena"] + figures["state"] + RAM_SLACK
