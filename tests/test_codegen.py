"""Generated C: determinism, strict builds, the header's promises, RAM, sanitizers, I/O modes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from runtime_py.kernels import KERNELS
from tests.conftest import SHARED_MODEL_FILES, SHARED_MODELS, needs_shared_models
from tests.test_runtime import pool_chain
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend, compile_files, compiler, write_files
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lower.plan import NO_TECHNIQUES, plan_model
from toolchain.ops import REGISTRY
from toolchain.ops.emit import LINE_LIMIT


def test_every_registered_op_has_a_numpy_kernel_and_a_c_emitter():
    """One registry: what runtime_py runs, the generator emits."""
    assert sorted(REGISTRY) == sorted(KERNELS)
    assert all(callable(spec.emit) for spec in REGISTRY.values())


def test_generation_is_deterministic(tmp_path):
    data = pool_chain()
    first = generate(plan_model(parse_model(data, "m.tflite")), "m")
    second = generate(plan_model(parse_model(data, "m.tflite")), "m")
    assert first == second
    main(["gen", str(_write(tmp_path / "m.tflite", data)), "-o", str(tmp_path / "a")])
    main(["gen", str(tmp_path / "m.tflite"), "-o", str(tmp_path / "b")])
    for name in ["m.h", "m.c", "m_main.c"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_header_and_source_promises():
    mp = plan_model(parse_model(pool_chain(), "m.tflite"))
    files = generate(mp, "demo")
    header, source = files["demo.h"], files["demo.c"]
    assert f"#define DEMO_ARENA_BYTES {mp.arena_bytes}u" in header
    assert "int demo_invoke(void);" in header and "void *demo_input(int i);" in header
    assert "#define DEMO_INPUT0_DIMS { 1, 12, 12, 8 }" in header
    assert "DEMO_INPUT0_SCALE" in header and "DEMO_OUTPUT0_ZERO_POINT" in header
    assert re.search(r"ARENAC_ALIGN\(16\) static uint8_t demo_arena\[\d+\];", source)
    for banned in ["malloc", "free(", "printf", "stdio.h", "stdlib.h"]:
        assert banned not in source
    # one offset macro per planned tensor, named by it, its offset as the plan says
    for t, offset in mp.offset_of_tensor().items():
        assert f"/* tensor {t} '{mp.graph.tensors[t].name}':" in source
        assert f"#define DEMO_T{t} {offset}u\n" in source
    assert len(re.findall(r"^#define DEMO_T\d+ \d+u$", source, re.M)) == len(mp.offset_of_tensor())


def test_external_io_keeps_inputs_and_outputs_out_of_the_arena(tmp_path):
    data = pool_chain()
    model = parse_model(data, "m.tflite")
    inside = plan_model(model, techniques=NO_TECHNIQUES)
    outside = plan_model(model, external_io=True, techniques=NO_TECHNIQUES)
    assert outside.arena_bytes < inside.arena_bytes
    files = generate(outside, "ext", external_io=True)
    assert "int ext_invoke(const void *const inputs[1], void *const outputs[1]);" in files["ext.h"]
    write_files(files, str(tmp_path))
    binary = compile_files(str(tmp_path), "ext")
    x = random_inputs(model.main, seed=5)
    out = subprocess.run([binary], input=x[0].tobytes(), capture_output=True, check=True).stdout
    expected = ArenaInterpreter(inside).invoke(x)[0]
    assert np.frombuffer(out, np.int8).tolist() == expected.ravel().tolist()


def object_sizes(tmp_path, files: dict[str, str], name: str) -> dict[str, int]:
    """The RAM of the object file. Unoptimized: no static is dropped, so it is the most an
    optimizing build can keep, and it builds several times faster."""
    write_files(files, str(tmp_path))
    subprocess.run(
        ["cc", "-std=c99", "-O0", "-c", f"{name}.c", "-o", f"{name}.o"], cwd=tmp_path, check=True
    )
    out = subprocess.run(
        ["size", "-A", f"{name}.o"], cwd=tmp_path, check=True, capture_output=True, text=True
    ).stdout
    sections = dict(re.findall(r"^(\.\w[\w.]*)\s+(\d+)", out, re.MULTILINE))
    ram = sum(int(v) for k, v in sections.items() if k.startswith((".data", ".bss")))
    return {"ram": ram}


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_ram_is_the_arena_plus_state_plus_little(tmp_path, path):
    mp = plan_model(read_model(path))
    ram = object_sizes(tmp_path, generate(mp, "m"), "m")["ram"]
    _, state = mp.state_layout()
    assert mp.arena_bytes <= ram < mp.arena_bytes + state + 1024


def test_built_models_clean_under_sanitizers():
    data = pool_chain()
    mp = plan_model(parse_model(data))
    with CBackend(mp, sanitize=True) as backend:
        assert check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)]).ok


def test_state_lives_in_its_own_block_and_reset_restores_it():
    """A variable (recurrent state) is read from the state block, outside the arena."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 8), "float32")
    state = b.variable("state", np.zeros((1, 8), np.float32))
    y = b.tensor("y", (1, 8), "float32")
    b.op("ADD", [x, state], [y])
    b.output(y)
    data = b.build()
    mp = plan_model(parse_model(data, "state.tflite"))
    offsets, state_bytes = mp.state_layout()
    assert state_bytes == 32 and state in offsets
    files = generate(mp, "s")
    assert "static uint8_t s_state[32];" in files["s.c"]
    assert "memset(s_state + 0, 0, 32);" in files["s.c"]
    with CBackend(mp) as backend:
        assert check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)]).ok


def test_align_reaches_the_state_block_and_each_piece_of_it():
    """--align 64 aligns the state block and every variable in it to 64 bytes (what follows
    one starts 64 bytes on), as it does the arena's buffers; the C declares the block so, and
    still gives runtime_py's outputs."""
    data = EXAMPLES["streaming_kws_int8"]()
    mp = plan_model(parse_model(data, "kws.tflite"), alignment=64)
    kept = [s for s in mp.state_slots if s.kind != "call_once"]
    assert kept and all(s.offset % 64 == 0 for s in kept)
    assert all(o % 64 == 0 for o in mp.plan.offsets)
    files = generate(mp, "kws")
    assert f"ARENAC_ALIGN(64) static uint8_t kws_state[{mp.state_bytes}]" in files["kws.c"]
    with CBackend(mp) as backend:
        assert check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)]).ok
    default = plan_model(parse_model(data, "kws.tflite"))
    assert all(s.offset % 16 == 0 for s in default.state_slots if s.kind != "call_once")
    assert default.state_bytes < mp.state_bytes


# A `for` over constant bounds: (var, start, stop, step or "" for ++).
CONSTANT_FOR = re.compile(
    r"for \((?:int )?(\w+) = (-?\d+); \1 < (-?\d+); (?:\+\+\1|\1\+\+|\1 \+= (\d+))\)")
STATIC_FUNCTION = re.compile(r"^static (?:inline )?[\w ]+?\b(\w+)\([^;]*$", re.M)


def style_problems(source: str) -> list[str]:
    """What a careful firmware engineer would not write: lines over 120 characters, loops of
    constant bounds that run once or never, a function defined twice."""
    problems = [f"{len(line)} characters: {line[:60]}..." for line in source.splitlines()
                if len(line) > LINE_LIMIT]
    for var, start, stop, step in CONSTANT_FOR.findall(source):
        trips = -(-(int(stop) - int(start)) // int(step or 1))
        if trips <= 1:
            problems.append(f"a loop over {var} of {max(trips, 0)} trips")
    defined = STATIC_FUNCTION.findall(source)
    problems += [f"{fn} defined {defined.count(fn)} times" for fn in sorted(set(defined))
                 if defined.count(fn) > 1]
    code = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    # (but arenac_clampf, which a file of float tensors defines whether its kernels clamp or not)
    problems += [f"{fn} defined but never called" for fn in sorted(set(defined) - {"arenac_clampf"})
                 if len(re.findall(rf"\b{fn}\(", code)) < 2]
    return problems


def test_the_style_check_finds_what_it_looks_for():
    bad = ("static void f(void) {\n  for (b = 0; b < 1; ++b) x();\n}\n"
           "static void f(void) {\n  for (i = 4; i < 4; ++i) y();\n}\n" + "/*" + "x" * 130 + "*/\n")
    assert len(style_problems(bad)) == 4
    unused = "static inline int32_t g(int32_t x) {\n  return x;\n}\n"
    assert style_problems(unused) == ["g defined but never called"]


@pytest.mark.parametrize("name, data", [
    *((name, make()) for name, make in EXAMPLES.items()),
    *((p.stem, p.read_bytes()) for p in SHARED_MODEL_FILES),
], ids=lambda v: v if isinstance(v, str) else "")
def test_generated_c_reads_like_careful_hand_written_c(name, data):
    mp = plan_model(parse_model(data, f"{name}.tflite"), time_limit=0.5)
    files = generate(mp, "m")
    for file_name, text in files.items():
        assert style_problems(text) == [], file_name


def host_gcc_runs(flags: tuple[str, ...]) -> bool:
    """Whether the host compiler is GCC for x86-64 and this processor runs what `flags` build."""
    try:
        version = subprocess.run([*compiler(), "--version"], capture_output=True, text=True,
                                 check=True).stdout
        machine = subprocess.run([*compiler(), "-dumpmachine"], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return ("clang" not in version.lower() and machine.startswith("x86_64")
            and " avx2 " in cpu.replace("\n", " "))


ZEN_FLAGS = ("-O3", "-march=znver3")


@pytest.mark.parametrize("name", ["vww_96_int8", "person_detect"])
def test_the_c_built_at_o3_for_zen_gives_runtime_pys_outputs(name):
    """GCC 12's induction-variable pass misplaced the outputs of vww's and person_detect's
    vectorized convolutions at -O3 with AMD Zen tuning (-march=native on such a core); the
    generated file turns that pass off there (see model.c.j2). Every other GCC and clang
    builds it as it stands. (A 224x224 MobileNetV2 built without the pragma came out right:
    these two models are the witnesses.)"""
    if not host_gcc_runs(ZEN_FLAGS):
        pytest.skip("needs GCC for x86-64 on a processor with AVX2")
    path = SHARED_MODELS / f"{name}.tflite"
    if not path.exists():
        pytest.skip(f"{path} not found")
    data = path.read_bytes()
    mp = plan_model(parse_model(data, f"{name}.tflite"))
    inputs = [random_inputs(mp.graph, seed=s) for s in range(3)]
    expected = [ArenaInterpreter(mp).invoke(values) for values in inputs]
    with CBackend(mp, flags=ZEN_FLAGS) as backend:
        got = backend.invoke_many(inputs)
    for want, have in zip(expected, got, strict=True):
        for a, b in zip(want, have, strict=True):
            np.testing.assert_array_equal(a, b)
