"""A model file cannot take arenac down with it: the oracles run in a child process, build
folders go on every path, and each failure is one line naming the file."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

from tests.conftest import SHARED_MODELS, needs_shared_models
from toolchain.errors import ModelError, RuntimeBackendError
from toolchain.front.builder import FILE_IDENTIFIER, AlignedBufferT
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lab.oracle_process import run_oracle, short
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import NO_TECHNIQUES, plan_model
from toolchain.tflm.embed import embed_plan, metadata_bytes

ROOT = Path(__file__).resolve().parents[1]


def repacked(model: fb.ModelT) -> bytes:
    builder = flatbuffers.Builder(1 << 16)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def for_tflm_only(offset: int) -> bytes:
    """tiny_cnn_int8 that LiteRT refuses (schema version 7) and TFLM loads, with an offline
    plan putting every tensor at `offset` bytes from the start of TFLM's arena.

    TFLM trusts offline offsets: at -16 its tensors overwrite the heap's bookkeeping in front
    of the arena, and glibc aborts (or the process faults); at -64 TFLM asks for a 4 GiB arena,
    refuses the model and says why on stderr."""
    model = fb.ModelT.InitFromPackedBuf(EXAMPLES["tiny_cnn_int8"](), 0)
    model.version = 7
    entries = [offset] * sum(len(g.tensors) for g in model.subgraphs)
    plan = np.frombuffer(metadata_bytes(entries, len(model.subgraphs)), np.uint8)
    buffers = []
    for b in model.buffers:
        aligned = AlignedBufferT()
        aligned.__dict__.update(vars(b))
        buffers.append(aligned)
    model.buffers = [*buffers, AlignedBufferT(data=plan)]
    model.metadata = [fb.MetadataT(name="OfflineMemoryAllocation", buffer=len(buffers))]
    return repacked(model)


def arenac(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolchain.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_a_crash_of_tflm_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "crashes_tflm.tflite"
    path.write_bytes(for_tflm_only(-16))
    result = arenac("check", str(path), "--inputs", "1", "--backends", "runtime_py")
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"arenac: {path}: the TFLite Micro interpreter crashed")
    assert "(signal " in result.stderr and result.stdout == ""


def test_tflm_chatter_stays_in_the_child_and_both_refusals_fit_one_line(tmp_path):
    path = tmp_path / "refused.tflite"
    path.write_bytes(for_tflm_only(-64))
    result = arenac("check", str(path), "--inputs", "1", "--backends", "runtime_py")
    assert result.returncode == 2, result
    assert result.stderr == (
        f"arenac: {path}: no oracle accepts the model (LiteRT: Model provided is schema "
        "version 7 not equal to supported version 3.; TFLite Micro: TFLM failed to allocate "
        "tensors)\n"
    )


@needs_shared_models
def test_check_of_a_model_only_tflm_runs_prints_nothing_on_stderr():
    result = arenac(
        "check", str(SHARED_MODELS / "person_detect.tflite"), "--inputs", "1",
        "--backends", "runtime_py",
    )
    assert result.returncode == 0 and result.stderr == "", result
    assert "tflm (oracle)" in result.stdout


def test_the_oracle_has_a_time_limit(tmp_path):
    data = EXAMPLES["tiny_cnn_int8"]()
    graph = parse_model(data).main
    with pytest.raises(RuntimeBackendError) as error:
        run_oracle(data, [random_inputs(graph, 0)], 1, "m.tflite", timeout=0.001)
    assert str(error.value) == "m.tflite: LiteRT timed out after 0.001 s"


def test_the_child_gives_litert_s_outputs_and_intermediate_tensors():
    data = EXAMPLES["residual_cnn_int8"]()
    graph = parse_model(data).main
    sets = [random_inputs(graph, seed) for seed in range(2)]
    wanted = [op.outputs[0] for op in graph.operators]
    run = run_oracle(data, sets, len(graph.outputs), tensors=wanted)
    here = LiteRTOracle(data, preserve_all_tensors=True)
    assert run.name == "litert-ref" and len(run.outputs) == len(run.tensors) == 2
    for values, outputs, tensors in zip(sets, run.outputs, run.tensors, strict=True):
        expected = here.invoke(values)
        assert all(np.array_equal(e, a) for e, a in zip(expected, outputs, strict=True))
        assert sorted(tensors) == sorted(wanted)
        assert all(np.array_equal(here.tensor(t), tensors[t]) for t in wanted)


def test_check_plan_names_the_file_when_no_oracle_accepts_it():
    data = for_tflm_only(-64)
    mp = plan_model(parse_model(data, "refused.tflite"), "greedy")
    with pytest.raises(RuntimeBackendError) as error:
        check_plan(mp, data)
    assert str(error.value).startswith("refused.tflite: no oracle accepts the model (LiteRT: ")


def test_reasons_are_cut_to_their_first_message():
    litert = "quantized_dimension must be in range [0, 1). Was 3.Tensor 33 has invalid q."
    assert short(litert) == "quantized_dimension must be in range [0, 1). Was 3."
    assert short("first\nsecond") == "first"
    assert short("x" * 500) == "x" * 97 + "..."


def failing_compiler(directory: Path) -> str:
    script = directory / "broken-cc"
    script.write_text(
        "#!/bin/sh\n"
        "echo 'model.c:1:1: error: first problem' >&2\n"
        "echo 'model.c:2:1: error: second problem' >&2\n"
        "exit 1\n"
    )
    script.chmod(0o755)
    return str(script)


def test_check_removes_its_build_folder_when_the_c_does_not_compile(tmp_path, example_path):
    path = example_path("tiny_cnn_int8")
    temp = tmp_path / "tmp"
    temp.mkdir()
    result = arenac(
        "check", str(path), "--inputs", "1",
        env={"CC": failing_compiler(tmp_path), "TMPDIR": str(temp)},
    )
    assert result.returncode == 2, result
    assert result.stderr == (
        f"arenac: {path}: generated C does not compile: model.c:1:1: error: first problem\n"
    )
    assert list(temp.iterdir()) == []


def test_the_c_backend_removes_its_folder_when_the_compiler_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    mp = plan_model(parse_model(EXAMPLES["tiny_cnn_int8"](), "m.tflite"), "greedy")
    with pytest.raises(RuntimeBackendError, match="no C compiler") as error:
        CBackend(mp)
    assert error.value.source == "m.tflite"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("arenac-")] == []


def test_a_failed_firmware_build_names_the_file_and_leaves_no_folder(monkeypatch, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    gcc = fake / "arm-none-eabi-gcc"
    gcc.write_text("#!/bin/sh\necho 'startup.c:1:1: error: no room' >&2\nexit 1\n")
    gcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    mp = plan_model(parse_model(EXAMPLES["tiny_cnn_int8"](), "m.tflite"), "greedy")
    try:
        QemuBackend(mp)
    except RuntimeBackendError as error:
        if "not on PATH" in error.message:
            pytest.skip(error.message)
        assert error.source == "m.tflite"
        assert error.message == "arm-none-eabi-gcc (compile) failed: startup.c:1:1: error: no room"
    else:
        pytest.fail("the build did not fail")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("arenac-")] == []


def with_quantization_vector_corrupt(field: str) -> bytes:
    """tiny_cnn_int8 whose input's quantization has a `field` vector (`min`, or the bytes of
    custom `details`) - vectors arenac never uses - with a length far beyond the file."""
    model = fb.ModelT.InitFromPackedBuf(EXAMPLES["tiny_cnn_int8"](), 0)
    quantization = model.subgraphs[0].tensors[model.subgraphs[0].inputs[0]].quantization
    if field == "min":
        quantization.min = [-1.0]
    else:
        quantization.detailsType = fb.QuantizationDetails.CustomQuantization
        quantization.details = fb.CustomQuantizationT()
        quantization.details.custom = [1, 2, 3, 4]
    data = bytearray(repacked(model))
    graph = fb.Model.GetRootAs(data, 0).Subgraphs(0)
    q = graph.Tensors(graph.Inputs(0)).Quantization()
    if field == "min":
        vector = q._tab.Vector(q._tab.Offset(4))  # field 0: min
    else:
        details = q.Details()
        vector = details.Vector(details.Offset(4))  # CustomQuantization field 0: custom
    struct.pack_into("<I", data, vector - 4, 0x3FFFFFFF)
    return bytes(data)


@pytest.mark.parametrize("field", ["min", "details"])
def test_a_corrupt_vector_only_embed_would_copy_is_refused_by_the_reader(field):
    """`embed` copies every field through the object API; the reader charges the ones it
    skips as well, so a length beyond the file is refused before anything is planned."""
    with pytest.raises(ModelError, match=r"corrupt flatbuffer \(tensor 0 \('input'\)") as e:
        parse_model(with_quantization_vector_corrupt(field), "odd.tflite")
    assert e.value.source == "odd.tflite"


def test_embed_of_a_file_the_object_api_cannot_read_is_one_model_error(monkeypatch):
    """What the reader does not visit (a field of a later schema, say) can still break the
    object API: that is one ModelError naming the file, not a traceback."""
    data = EXAMPLES["tiny_cnn_int8"]()
    mp = plan_model(parse_model(data, "odd.tflite"), "greedy", techniques=NO_TECHNIQUES)

    def unreadable(buf, pos):
        raise IndexError("offset out of range")

    monkeypatch.setattr(fb.ModelT, "InitFromPackedBuf", staticmethod(unreadable))
    with pytest.raises(ModelError, match="corrupt flatbuffer in a part arenac does not read") as e:
        embed_plan(data, mp, "odd.tflite")
    assert e.value.source == "odd.tflite"


def test_cli_embed_of_a_corrupt_file_is_one_line(tmp_path):
    path = tmp_path / "odd.tflite"
    path.write_bytes(with_quantization_vector_corrupt("details"))
    out = tmp_path / "out.tflite"
    result = arenac("embed", str(path), "-o", str(out))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result
    assert result.stderr.startswith(f"arenac: {path}: corrupt flatbuffer")
    assert not out.exists()


def holding(folder: Path) -> list[int]:
    """The processes with a descriptor open on a file in `folder` (Linux's /proc)."""
    pids = []
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd).startswith(str(folder)) for fd in fds.iterdir()):
                pids.append(int(fds.parent.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return pids


def test_a_killed_check_leaves_no_oracle_log_and_no_process_behind(tmp_path):
    """The oracle's log has no name, so a check killed while the oracle runs (here on a loop
    that never ends) leaves nothing in the temporary folder; a crash's log is still read. The
    oracle's process outlives a killed parent (the fork server is its parent), so its processor
    time is capped: the kernel ends it soon after the timeout would have."""
    from tests.test_budget import endless_loop

    path = tmp_path / "loop.tflite"
    path.write_bytes(endless_loop(0))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # The fork server is started (and has imported the interpreters) before the timed run:
    # cold, under a busy suite, its start alone outlasted the timeout, and the oracle was
    # killed before it ever held its log.
    program = ("import numpy as np, sys\n"
               "from toolchain.lab.oracle_process import forkserver, run_oracle\n"
               "warm = forkserver().Process(target=int)\n"
               "warm.start()\n"
               "warm.join()\n"
               "print('started', flush=True)\n"
               "run_oracle(open(sys.argv[1], 'rb').read(), [[np.zeros(1, np.int32)]], 1,"
               " timeout=4)\n")
    child = subprocess.Popen([sys.executable, "-c", program, str(path)],
                             env={**os.environ, "TMPDIR": str(scratch)},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"
        for _ in range(600):  # the oracle's child is running once it holds the log too
            if set(holding(scratch)) - {child.pid}:
                break
            time.sleep(0.1)
        assert set(holding(scratch)) - {child.pid}, "the oracle never started"
        time.sleep(0.5)  # well before the parent's own timeout
        child.kill()
        child.wait(60)
    finally:
        child.kill()
    left = [p.name for p in scratch.rglob("*") if "oracle" in p.name]
    assert left == []
    for _ in range(1200):  # 9 s of processor time, on a busy machine maybe a minute
        if not holding(scratch):
            break
        time.sleep(0.1)
    assert holding(scratch) == [], "the oracle still runs after its parent was killed"


def test_the_oracle_starts_under_a_temporary_folder_too_long_for_a_socket(tmp_path):
    """The fork server listens on a socket in the temporary folder; under a TMPDIR deep
    enough that the socket's path passes AF_UNIX's 108 bytes, the oracle still answers."""
    scratch = tmp_path / ("deep" * 20)
    scratch.mkdir()
    assert len(str(scratch)) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") >= 108
    path = tmp_path / "tiny.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    program = ("import sys\n"
               "from toolchain.front.reader import parse_model\n"
               "from toolchain.lab.check import random_inputs\n"
               "from toolchain.lab.oracle_process import run_oracle\n"
               "data = open(sys.argv[1], 'rb').read()\n"
               "model = parse_model(data, sys.argv[1])\n"
               "run = run_oracle(data, [random_inputs(model.main, 0)], len(model.main.outputs))\n"
               "print(run.name, run.outputs[0][0].shape)\n")
    result = subprocess.run([sys.executable, "-c", program, str(path)], cwd=ROOT,
                            env={**os.environ, "TMPDIR": str(scratch)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "litert-ref (1, 10)\n"
