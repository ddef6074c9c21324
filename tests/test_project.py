"""`arenac project`: the project builds with make and with CMake as written, runs under QEMU on
its board, and prints the outputs `arenac run` saves for the same input; arenac never replaces
a file the user edited without --force."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

from tests.ops.test_circular_buffer import buffered
from toolchain.cli import main
from toolchain.front.examples import EXAMPLES
from toolchain.lab import qemu_backend
from toolchain.lab.check import difference

needs_tools = pytest.mark.skipif(bool(qemu_backend.missing()) or shutil.which("make") is None,
                                 reason="no Cortex-M toolchain, QEMU or make")


def printed_outputs(text: str) -> list[bytes]:
    """The outputs main.c printed, as bytes."""
    outputs: list[bytes] = []
    for line in text.splitlines():
        if line.startswith("output "):
            outputs.append(b"")
        elif outputs and line and not line.startswith(("ticks", "cycles")):
            outputs[-1] += bytes(int(h, 16) for h in line.split())
    return outputs


def same_as_run(printed: list[bytes], tmp_path, model, board: str) -> bool:
    """The printed outputs are `arenac run`'s: integers bit for bit, floats within check's
    tolerance (the C sums float32 in its own order)."""
    wanted = run_outputs(tmp_path, model, board)
    return len(printed) == len(wanted) and all(
        difference(w, np.frombuffer(p, w.dtype).reshape(w.shape)).mismatches == 0
        for p, w in zip(printed, wanted, strict=True))


def run_outputs(tmp_path, model, board: str) -> list[np.ndarray]:
    """`arenac run` on check's seed-0 input for the board's target."""
    from toolchain.front.reader import read_model
    from toolchain.lab.check import random_inputs
    from toolchain.lab.project import board_target

    graph = read_model(str(model)).main
    inputs = [tmp_path / f"in{i}.npy" for i in range(len(graph.inputs))]
    for path, value in zip(inputs, random_inputs(graph, 0), strict=True):
        np.save(path, value)
    out = tmp_path / "run"
    args = ["run", str(model), "--target", board_target(board).name, "--output-dir", str(out)]
    assert main([*args, *(x for p in inputs for x in ("--input", str(p)))]) == 0
    return [np.load(out / f"output_{i}.npy") for i in range(len(graph.outputs))]


CASES = [("tiny_cnn_int8", "mps2-an386"), ("residual_cnn_float32", "mps2-an505"),
         ("streaming_kws_int8", "mps3-an547"), ("tiny_cnn_int8", "mps2-an500")]


@needs_tools
@pytest.mark.parametrize("example, board", CASES)
def test_the_project_builds_with_make_and_runs_as_arenac_run(example, board, tmp_path, capsys):
    model = tmp_path / f"{example}.tflite"
    model.write_bytes(EXAMPLES[example]())
    project = tmp_path / "project"
    assert main(["project", str(model), "-o", str(project), "--board", board]) == 0
    capsys.readouterr()
    built = subprocess.run(["make", "-C", str(project), "run"], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    printed = built.stdout + built.stderr  # QEMU's semihosting console is its stderr
    assert same_as_run(printed_outputs(printed), tmp_path, model, board)
    assert "ticks " in printed


@needs_tools
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
@pytest.mark.parametrize("example, board", CASES[:2])
def test_the_project_builds_with_cmake(example, board, tmp_path, capsys):
    model = tmp_path / f"{example}.tflite"
    model.write_bytes(EXAMPLES[example]())
    project = tmp_path / "project"
    assert main(["project", str(model), "-o", str(project), "--board", board]) == 0
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(project), "-B", str(build),
                    f"-DCMAKE_TOOLCHAIN_FILE={project / 'arm-none-eabi.cmake'}"],
                   check=True, capture_output=True)
    ran = subprocess.run(["cmake", "--build", str(build), "--target", "run"],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert same_as_run(printed_outputs(ran.stdout + ran.stderr), tmp_path, model, board)


@needs_tools
def test_a_streaming_model_invokes_until_its_buffer_lets_it_run(tmp_path, capsys):
    model = tmp_path / "stream.tflite"
    model.write_bytes(buffered(3, (1, 4), {"cycles_max": 3}))
    project = tmp_path / "project"
    assert main(["project", str(model), "-o", str(project)]) == 0
    built = subprocess.run(["make", "-C", str(project), "run"], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    (frames,) = printed_outputs(built.stdout + built.stderr)
    assert len(frames) == 12 and "invoke failed" not in built.stderr


def test_an_edited_file_is_kept_without_force(tmp_path, capsys):
    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    project = tmp_path / "project"
    args = ["project", str(model), "-o", str(project)]
    assert main(args) == 0
    assert main(args) == 0  # nothing edited: written again
    main_c = project / "main.c"
    main_c.write_text(main_c.read_text() + "/* mine */\n")
    capsys.readouterr()
    assert main(args) == 2
    assert "main.c was edited" in capsys.readouterr().err
    assert main_c.read_text().endswith("/* mine */\n")
    assert main([*args, "--force"]) == 0
    assert not main_c.read_text().endswith("/* mine */\n")
    assert sorted(os.listdir(project)) == sorted([
        ".arenac-project", "CMakeLists.txt", "Makefile", "arm-none-eabi.cmake", "link.ld",
        "m.c", "m.h", "main.c", "semihosting.h", "startup.c"])


def test_an_unknown_board_is_one_line(tmp_path, capsys):
    model = tmp_path / "m.tflite"
    model.write_bytes(buffered(2, (1, 2)))
    with pytest.raises(SystemExit) as exit_:
        main(["project", str(model), "-o", str(tmp_path / "p"), "--board", "nucleo"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


def sections(elf) -> dict[str, tuple[int, int]]:
    """`arm-none-eabi-size -A`: section -> (bytes, address)."""
    out = subprocess.run(["arm-none-eabi-size", "-A", str(elf)], capture_output=True, text=True,
                         check=True).stdout
    return {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^(\.\S+)\s+(\d+)\s+(\d+)", out,
                                                               re.M)}


@needs_tools
@pytest.mark.parametrize("part", ["nucleo-l4r5zi", "nucleo-h7a3zi-q", "nucleo-u575zi-q"])
def test_a_real_boards_project_is_laid_out_in_its_memory(part, tmp_path, capsys):
    """An MLPerf Tiny reference board: the project builds with make and with CMake for its core,
    its code in the part's flash with the vector table first (the initial stack pointer the top
    of its main RAM, the reset handler in flash), the data and arena in that RAM, and main.c
    times the invoke with the core's cycle counter."""
    from toolchain.lab.firmware import tool
    from toolchain.targets import PARTS

    spec = PARTS[part]
    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    project = tmp_path / "project"
    assert main(["project", str(model), "-o", str(project), "--board", part]) == 0
    assert "load the ELF with a probe" in capsys.readouterr().out
    built = subprocess.run(["make", "-C", str(project)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    elf = project / "m.elf"
    found = sections(elf)
    flash, ram = spec.flash, spec.ram
    for name in (".text", ".rodata"):
        size, at = found[name]
        assert flash.origin <= at and at + size <= flash.origin + flash.length, name
    for name in (".data", ".bss"):
        size, at = found[name]
        assert ram.origin <= at and at + size <= ram.origin + ram.length, name
    assert found[".text"][1] == flash.origin
    image = subprocess.run([tool("objcopy"), "-O", "binary", "-j", ".text", str(elf),
                            str(tmp_path / "text.bin")], capture_output=True)
    assert image.returncode == 0
    stack_top, reset = struct.unpack_from("<II", (tmp_path / "text.bin").read_bytes())
    assert stack_top == ram.origin + ram.length
    assert flash.origin < reset < flash.origin + found[".text"][0]
    main_c = (project / "main.c").read_text()
    assert "DWT CYCCNT" in main_c and ("DWT_LAR" in main_c) == (spec.target == "cortex-m7")
    assert "run:" not in (project / "Makefile").read_text()
    if shutil.which("cmake"):
        build = tmp_path / "build"
        subprocess.run(["cmake", "-S", str(project), "-B", str(build),
                        f"-DCMAKE_TOOLCHAIN_FILE={project / 'arm-none-eabi.cmake'}"],
                       check=True, capture_output=True)
        cmade = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True,
                               timeout=300)
        assert cmade.returncode == 0, cmade.stdout + cmade.stderr
        assert sections(build / "m.elf")[".text"][1] == flash.origin


def test_a_real_board_has_no_serial_self_test_yet(tmp_path, capsys):
    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    assert main(["project", str(model), "-o", str(tmp_path / "p"), "--board", "nucleo-l4r5zi",
                 "--serial"]) == 2
    assert "UART is not known" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


STM32F405 = """[part]
name = "stm32f405"
target = "cortex-m4"
flash = { origin = 0x08000000, size = "1M" }
ram = { origin = 0x20000000, size = "128K" }
"""


@needs_tools
def test_a_part_described_in_a_memory_file_runs_on_it(tmp_path, capsys):
    """Any part from its memory map (--memory FILE with a [part]): an STM32F405's, which QEMU
    models as the netduinoplus2 machine; the project built as written runs there, its printed
    outputs `arenac run`'s (QEMU does not count the DWT's cycles: it prints 0)."""
    from toolchain.lab.qemu_backend import qemu_command

    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["residual_cnn_int8"]())
    memory = tmp_path / "part.toml"
    memory.write_text(STM32F405)
    project = tmp_path / "project"
    assert main(["project", str(model), "-o", str(project), "--memory", str(memory)]) == 0
    assert capsys.readouterr().out.startswith("stm32f405 (cortex-m4) project")
    built = subprocess.run(["make", "-C", str(project)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(qemu_command(str(project / "m.elf"), "netduinoplus2"),
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    printed = ran.stdout + ran.stderr
    assert same_as_run(printed_outputs(printed), tmp_path, model, "mps2-an386")
    assert "cycles " in printed


@pytest.mark.parametrize("edit, says", [
    (("1M", "4096M"), "must be from 1 byte to 4 GiB"),
    (("0x20000000", "0x08000004"), "flash and ram overlap"),
    (('"cortex-m4"', '"generic"'), "must be a Cortex-M target"),
    (('name = "stm32f405"', 'name = "a b"'), "part name 'a b'"),
    (("[part]", "[part]\nclock = 1"), "no more"),
])
def test_a_bad_part_is_one_line(edit, says, tmp_path, capsys):
    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    memory = tmp_path / "part.toml"
    memory.write_text(STM32F405.replace(*edit))
    assert main(["project", str(model), "-o", str(tmp_path / "p"), "--memory", str(memory)]) == 2
    err = capsys.readouterr().err
    assert says in err and str(memory) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()


def test_a_board_and_a_part_are_one_too_many(tmp_path, capsys):
    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    memory = tmp_path / "part.toml"
    memory.write_text(STM32F405)
    assert main(["project", str(model), "-o", str(tmp_path / "p"), "--memory", str(memory),
                 "--board", "mps2-an386"]) == 2
    assert "give one" in capsys.readouterr().err
