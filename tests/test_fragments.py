"""`gen` writes NAME.cmake and NAME.mk: a firmware project builds the model through each, and
the program it builds computes what runtime_py computes."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab import firmware
from toolchain.lower.plan import plan_model
from toolchain.targets import CODE_FLAGS, get_target


def int8_model() -> bytes:
    b = ModelBuilder("int8", seed=11)
    x = b.input("x", (1, 8, 8, 3), "int8", scale=0.05, zero_point=-2)
    c = b.conv_2d(x, 6, 3, padding="SAME", activation="RELU")
    b.output(b.max_pool_2d(c, 2, 2, "VALID"))
    return b.build()


def float_softmax() -> bytes:
    b = ModelBuilder("float32", seed=12)
    x = b.input("x", (1, 10), "float32")
    b.output(b.softmax(b.fully_connected(x, 6)))
    return b.build()


def generated(tmp_path, data: bytes, name: str = "net") -> str:
    model = tmp_path / "m.tflite"
    model.write_bytes(data)
    out = tmp_path / "firmware" / "models" / name
    assert main(["gen", str(model), "-o", str(out), "--name", name]) == 0
    return str(out)


def run_app(binary: str, data: bytes, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Run the built program on one random input; (its output, runtime_py's)."""
    mp = plan_model(parse_model(data))
    tensor = mp.graph.tensors[mp.graph.inputs[0]]
    rng = np.random.default_rng(seed)
    if tensor.dtype == "int8":
        x = rng.integers(-128, 128, tensor.shape, dtype=np.int8)
    else:
        x = rng.standard_normal(tensor.shape).astype(np.float32)
    (want,) = ArenaInterpreter(mp).invoke([x])
    result = subprocess.run([binary], input=x.tobytes(), capture_output=True, check=True)
    got = np.frombuffer(result.stdout, want.dtype).reshape(want.shape)
    return got, want


def project(tmp_path, name: str) -> str:
    """A firmware project beside the generated folder; its main.c is the generated harness."""
    app = tmp_path / "firmware" / "app"
    app.mkdir(parents=True)
    shutil.copy(tmp_path / "firmware" / "models" / name / f"{name}_main.c", app / "main.c")
    return str(app)


def test_make_fragment_builds_the_model(tmp_path):
    data = int8_model()
    folder = generated(tmp_path, data)
    assert {"net.cmake", "net.mk"} <= set(os.listdir(folder))
    text = open(os.path.join(folder, "net.mk")).read()
    assert "NET_LDLIBS :=\n" in text  # no libm: the link below has none
    app = project(tmp_path, "net")
    with open(os.path.join(app, "Makefile"), "w") as f:
        f.write("include ../models/net/net.mk\n"
                "CFLAGS += $(NET_CFLAGS) -O2 -Wall -Wextra -Wpedantic -Werror\n"
                "app: main.c $(NET_SRCS)\n"
                "\t$(CC) $(CFLAGS) -o $@ main.c $(NET_SRCS) $(NET_LDLIBS)\n")
    subprocess.run(["make", "-s", "-C", app], check=True, capture_output=True)
    got, want = run_app(os.path.join(app, "app"), data)
    assert got.dtype == np.int8 and np.array_equal(got, want)


def test_make_fragment_links_libm_when_the_model_calls_it(tmp_path):
    data = float_softmax()
    folder = generated(tmp_path, data)
    text = open(os.path.join(folder, "net.mk")).read()
    assert "NET_LDLIBS := -lm\n" in text
    assert "set(NET_LIBRARIES m)" in open(os.path.join(folder, "net.cmake")).read()
    app = project(tmp_path, "net")
    with open(os.path.join(app, "Makefile"), "w") as f:
        f.write("include ../models/net/net.mk\n"
                "app: main.c $(NET_SRCS)\n"
                "\t$(CC) $(NET_CFLAGS) -O2 -o $@ main.c $(NET_SRCS) $(NET_LDLIBS)\n")
    subprocess.run(["make", "-s", "-C", app], check=True, capture_output=True)
    got, want = run_app(os.path.join(app, "app"), data)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-7) and got.std() > 0


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_fragment_builds_the_model(tmp_path):
    data = int8_model()
    generated(tmp_path, data)
    app = project(tmp_path, "net")
    with open(os.path.join(app, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.13)\n"
                "project(app C)\n"
                "include(${CMAKE_CURRENT_SOURCE_DIR}/../models/net/net.cmake)\n"
                "include(${CMAKE_CURRENT_SOURCE_DIR}/../models/net/net.cmake)\n"  # guarded
                "add_executable(app main.c)\n"
                "target_link_libraries(app PRIVATE net)\n")
    build = str(tmp_path / "build")
    subprocess.run(["cmake", "-S", app, "-B", build], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build], check=True, capture_output=True)
    got, want = run_app(os.path.join(build, "app"), data, seed=1)
    assert np.array_equal(got, want)


def test_libm_follows_the_kernels_that_call_math_h():
    """A float model whose kernels call no <math.h> function links no libm; SOFTMAX's expf
    does (the kernels declare it, Kernel.includes)."""
    b = ModelBuilder("float32", seed=13)
    b.output(b.fully_connected(b.input("x", (1, 10), "float32"), 6))
    plain = generate(plan_model(parse_model(b.build())), "net", fragments=True)
    assert "NET_LDLIBS :=\n" in plain["net.mk"] and "#include <math.h>" in plain["net.c"]
    softmax = generate(plan_model(parse_model(float_softmax())), "net", fragments=True)
    assert "NET_LDLIBS := -lm\n" in softmax["net.mk"]


def test_target_flags_are_offered(tmp_path):
    mp = plan_model(parse_model(int8_model()), target="cortex-m4")
    fragments = generate(mp, "net", fragments=True)
    assert "NET_TARGET_CFLAGS := -mcpu=cortex-m4 -mthumb" in fragments["net.mk"]
    assert "set(NET_TARGET_FLAGS -mcpu=cortex-m4 -mthumb" in fragments["net.cmake"]


def test_target_flags_are_the_flags_the_firmware_is_built_with():
    """The fragments' flags for a Cortex-M target are the CPU's and every code-generation flag
    the measured firmware build passes (-fno-delete-null-pointer-checks among them)."""
    mp = plan_model(parse_model(int8_model()), target="cortex-m55")
    fragments = generate(mp, "net", fragments=True)
    line = next(x for x in fragments["net.mk"].splitlines() if x.startswith("NET_TARGET_CFLAGS"))
    offered = line.split(":=")[1].split()
    assert offered == [*get_target("cortex-m55").flags, *CODE_FLAGS]
    assert set(CODE_FLAGS) <= set(firmware.C_FLAGS)
    assert "-fno-delete-null-pointer-checks" in offered


# A firmware's own source in GNU C (asm, typeof): arenac's -std=c99 must not reach it.
GNU_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "alpha.h"
#include "beta.h"

int main(void) {
  static uint8_t x[ALPHA_INPUT0_BYTES];
  typeof(alpha_invoke()) status;
  asm volatile("" ::: "memory");
  if (fread(x, 1, sizeof x, stdin) != sizeof x) return 2;
  memcpy(alpha_input(0), x, sizeof x); /* one model at a time: they share the arena */
  status = alpha_invoke();
  fwrite(alpha_output(0), 1, ALPHA_OUTPUT0_BYTES, stdout);
  memcpy(beta_input(0), x, sizeof x);
  status |= beta_invoke();
  fwrite(beta_output(0), 1, BETA_OUTPUT0_BYTES, stdout);
  return status;
}
"""


def two_models(tmp_path) -> tuple[str, bytes, bytes]:
    """Two models generated together (one shared arena), and a GNU C main using both."""
    alpha, beta = int8_model(), tmp_path / "b.tflite"
    b = ModelBuilder("int8", seed=21)
    x = b.input("x", (1, 8, 8, 3), "int8", scale=0.05, zero_point=-2)
    b.output(b.conv_2d(x, 4, 1, activation="RELU"))
    beta.write_bytes(b.build())
    (tmp_path / "a.tflite").write_bytes(alpha)
    out = tmp_path / "firmware" / "models"
    assert main(["gen", str(tmp_path / "a.tflite"), str(beta), "-o", str(out),
                 "--name", "alpha", "--name", "beta"]) == 0
    app = tmp_path / "firmware" / "app"
    app.mkdir(parents=True)
    (app / "main.c").write_text(GNU_MAIN)
    return str(app), alpha, beta.read_bytes()


def outputs_of(binary: str, alpha: bytes, beta: bytes) -> None:
    """The program's two outputs on one input equal runtime_py's for each model."""
    mps = [plan_model(parse_model(data)) for data in (alpha, beta)]
    x = np.random.default_rng(5).integers(-128, 128, (1, 8, 8, 3), dtype=np.int8)
    wants = [ArenaInterpreter(mp).invoke([x])[0] for mp in mps]
    got = subprocess.run([binary], input=x.tobytes(), capture_output=True, check=True).stdout
    split = wants[0].nbytes
    assert got[:split] == wants[0].tobytes() and got[split:] == wants[1].tobytes()


def test_two_models_fragments_link_once_beside_gnu_c_with_make(tmp_path):
    app, alpha, beta = two_models(tmp_path)
    mk = open(os.path.join(app, "..", "models", "alpha.mk")).read()
    assert "arenac_shared.c" in mk and "ifndef ARENAC_SHARED_OBJ" in mk
    with open(os.path.join(app, "Makefile"), "w") as f:
        f.write("CFLAGS = -std=gnu11 -O2 -Wall -Werror\n"
                "include ../models/alpha.mk\n"
                "include ../models/beta.mk\n"
                "OBJS = main.o $(ALPHA_OBJS) $(BETA_OBJS)\n"
                "CPPFLAGS += $(ALPHA_CPPFLAGS) $(BETA_CPPFLAGS)\n"
                "LDLIBS += $(ALPHA_LDLIBS) $(BETA_LDLIBS)\n"
                "app: $(OBJS)\n"
                "\t$(CC) -o $@ $(OBJS) $(LDLIBS)\n")
    result = subprocess.run(["make", "-C", app], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("arenac_shared.c") == 1  # compiled once
    assert "-std=gnu11 -O2 -Wall -Werror -std=c99" in result.stdout  # arenac's last, its own
    assert "main.c" not in " ".join(line for line in result.stdout.splitlines()
                                    if "-std=c99" in line)
    outputs_of(os.path.join(app, "app"), alpha, beta)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_two_models_fragments_link_once_beside_gnu_c_with_cmake(tmp_path):
    app, alpha, beta = two_models(tmp_path)
    with open(os.path.join(app, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.13)\n"
                "project(app C)\n"
                "set(CMAKE_C_STANDARD 11)\n"
                "set(CMAKE_C_EXTENSIONS ON)\n"
                "include(${CMAKE_CURRENT_SOURCE_DIR}/../models/alpha.cmake)\n"
                "include(${CMAKE_CURRENT_SOURCE_DIR}/../models/beta.cmake)\n"
                "add_executable(app main.c)\n"
                "target_link_libraries(app PRIVATE alpha beta)\n")
    build = str(tmp_path / "build")
    subprocess.run(["cmake", "-S", app, "-B", build], check=True, capture_output=True)
    result = subprocess.run(["cmake", "--build", build], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    outputs_of(os.path.join(build, "app"), alpha, beta)
