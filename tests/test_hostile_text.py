"""A model file is hostile input: its text never reaches generated files unescaped, and what
`generate` accepts compiles with -Werror and computes what runtime_py computes (or is refused)."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from toolchain.c.generate import generate
from toolchain.errors import ArenacError, ModelError, PlanError, UnsupportedOpError
from toolchain.files import write_files_atomic
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.ir import Quantization
from toolchain.lab.c_backend import (
    STRICT_FLAGS,
    CBackend,
    compile_files,
    compiler,
    split_outputs,
    write_files,
)
from toolchain.lab.check import random_inputs
from toolchain.lower.plan import Techniques, plan_model
from toolchain.text import C_IDENTIFIER_LIMIT, C_KEYWORDS, c_identifier, c_text
from toolchain.views.report import memory_map_svg

HOSTILE = [
    "x */ int injected = 1; /*",
    "/* opens a comment",
    "two\nlines\r\n",
    "nul\x00byte",
    "{{ 7 * 7 }}",
    "{% if true %}jinja{% endif %}",
    "<script>alert(1)</script>",
    "back\\slash\\",
    "trigraph ??/ ??= ???",
    "bidi \u202eevil\u2066 isolate",
    "]]> & \"quoted\" 'single'",
    "tab\there \x7f \x85 é 中 😀",
    "ends in star *",
    "/ starts with slash",
    "long " * 40,
]
HOSTILE_SOURCE = "models/*/ evil\n\u202e??/.tflite"
INJECTED = "x */ int injected = 1; /*"


def hostile_model(dtype: str) -> bytes:
    """Convolutions, pooling, a residual add, reshape, fully connected and softmax, with every
    tensor renamed to hostile text and a hostile description."""
    b = ModelBuilder(dtype, seed=4, description="\n".join(HOSTILE))
    q = {"scale": 0.05, "zero_point": -3} if dtype == "int8" else {}
    x = b.input("x", (1, 8, 8, 4), dtype, **q)
    c = b.conv_2d(x, 8, 3, activation="RELU")
    d = b.depthwise_conv_2d(c, 3)
    m = b.max_pool_2d(b.add(c, d), 2)
    f = b.fully_connected(b.reshape(m, (1, -1)), 10)
    b.output(b.softmax(f))
    model = fb.ModelT.InitFromPackedBuf(b.build(), 0)
    for i, tensor in enumerate(model.subgraphs[0].tensors):
        tensor.name = f"{i} {HOSTILE[i % len(HOSTILE)]}"
    model.subgraphs[0].name = HOSTILE[0]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def without_comments(c_source: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", c_source, flags=re.DOTALL)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_hostile_names_compile_strictly_and_compute_the_same(dtype):
    model = parse_model(hostile_model(dtype), HOSTILE_SOURCE)
    assert INJECTED in model.main.tensors[0].name  # the names did reach the IR
    mp = plan_model(model)
    files = generate(mp, "hostile")
    for name, text in files.items():
        assert text.isascii() and "\x00" not in text, name
        assert "??" not in text and "\\\n" not in text, name
        assert "injected" not in without_comments(text), name
        assert not re.search(r"/\*[^\n]*?/\*", text), name  # no comment opens inside another
    assert "{{ 7 * 7 }}" in files["hostile.c"]  # rendered, never parsed as a template
    x = random_inputs(model.main, seed=1)
    with CBackend(mp, name="hostile") as backend:  # -std=c99 -Wall -Wextra -Wpedantic -Werror
        compiled = backend.invoke(x)
    expected = ArenaInterpreter(mp).invoke(x)
    assert len(compiled) == len(expected)
    for got, want in zip(compiled, expected, strict=True):
        assert got.dtype == want.dtype
        if dtype == "int8":
            assert np.array_equal(got, want)
        else:  # the C may sum in another order
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_an_injected_declaration_stays_inside_its_comment():
    b = ModelBuilder("float32")
    x = b.input(INJECTED, (1, 4), "float32")
    y = b.tensor(INJECTED, (1, 4), "float32")
    b.op("RELU", [x], [y])
    b.output(y)
    files = generate(plan_model(parse_model(b.build(), INJECTED)), "m")
    assert "injected" in files["m.h"] and "injected" in files["m.c"]  # the name is shown...
    for text in files.values():
        assert "injected" not in without_comments(text)  # ...but only ever inside a comment


def test_check_on_hostile_names_runs_only_the_model(tmp_path):
    """The whole CLI path: plan, generate, compile, run, compare with the oracle; the path,
    which the generated files name too, is hostile as well."""
    path = tmp_path / "evil \u202e ??= \n 'name' *.tflite"
    path.write_bytes(hostile_model("int8"))
    result = subprocess.run(
        [sys.executable, "-m", "toolchain.cli", "check", str(path), "--inputs", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", [["inspect"], ["plan"], ["check", "--inputs", "1"]])
def test_hostile_names_reach_the_terminal_escaped(tmp_path, command):
    """An ESC (a terminal's control sequences, OSC titles), a bidirectional override or any
    other control in a tensor name is printed escaped by every text view."""
    model = fb.ModelT.InitFromPackedBuf(hostile_model("int8"), 0)
    for i, tensor in enumerate(model.subgraphs[0].tensors):
        tensor.name = f"{i} \x1b]0;title\x07 \x1b[2J \u202eevil \x9b"
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path = tmp_path / "names.tflite"
    path.write_bytes(bytes(builder.Output()))
    result = subprocess.run(
        [sys.executable, "-m", "toolchain.cli", command[0], str(path), *command[1:],
         *(["--per-layer"] if command[0] == "check" else [])],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    assert "\\x1b" in shown or "\\u202e" in shown  # the names are there, escaped
    assert not any(c in shown for c in "\x1b\x07\x9b\u202e")


def test_the_memory_map_svg_is_well_formed_xml():
    # every tensor whole, so that each hostile name has a buffer
    mp = plan_model(parse_model(hostile_model("int8"), HOSTILE_SOURCE),
                    techniques=Techniques(tiling="off"))
    svg = memory_map_svg(mp)
    root = ET.fromstring(svg)  # raises on anything not well-formed
    titles = [e.text or "" for e in root.iter("{http://www.w3.org/2000/svg}title")]
    shown = "\n".join(titles)
    assert "<script>alert(1)</script>" in shown and "]]> & \"quoted\"" in shown
    assert "nul\\x00byte" in shown and "\x00" not in shown
    assert "\u202e" not in svg and "\u2066" not in svg
    assert "models/" not in svg  # the map names the model by its SHA-256, never by its path


def test_nan_and_infinite_constants_compile_and_match_runtime_py():
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -np.nan, 3e38], np.float32)
    b = ModelBuilder("float32")
    x = b.input("x", (2, 8), "float32")
    c = b.const("special", special.reshape(1, 8))
    s, p = b.tensor("sum", (2, 8), "float32"), b.tensor("product", (2, 8), "float32")
    b.op("ADD", [x, c], [s])
    b.op("MUL", [s, c], [p])
    b.output(p)
    mp = plan_model(parse_model(b.build(), "special.tflite"))
    assert "NAN" in generate(mp, "m")["m.c"]
    inputs = [np.array([[1, -2, 0, 0, 5, 1e30, 2, 3e38], [0, 1, 2, 3, 4, 5, 6, 7]], np.float32)]
    with CBackend(mp) as backend:
        got = backend.invoke(inputs)[0]
    want = ArenaInterpreter(mp).invoke(inputs)[0]
    assert np.isnan(want).any() and np.isfinite(want).any()  # an infinity saturates to FLT_MAX
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got, want, equal_nan=True)


def with_tensor(mp, t: int, **changes):
    """The plan with tensor t of its graph changed, as any caller of generate() may build it
    (the reader's own checks are not what these tests are about)."""
    tensors = list(mp.graph.tensors)
    tensors[t] = dataclasses.replace(tensors[t], **changes)
    return with_graph(mp, tensors=tuple(tensors))


def test_header_macros_compile_for_any_scale_and_zero_point(tmp_path):
    """SCALE and ZERO_POINT macros of odd but representable values are valid C where used."""
    b = ModelBuilder("int8")
    x = b.input("x", (1, 4), "int8", 0.5, 1)
    y = b.tensor("y", (2, 2), "int8", 0.5, 1)
    b.op("RESHAPE", [x], [y], {"new_shape": [2, 2]})
    b.output(y)
    mp = plan_model(parse_model(b.build(), "odd.tflite"))
    mp = with_tensor(mp, x, quantization=Quantization((float("nan"),), (-(2**63),)))
    mp = with_tensor(mp, y, quantization=Quantization((float("-inf"),), (2**40,)))
    files = generate(mp, "odd")
    files["use.c"] = (
        '#include "odd.h"\n'
        "float input_scale(void) { return ODD_INPUT0_SCALE; }\n"
        "float output_scale(void) { return ODD_OUTPUT0_SCALE; }\n"
        "long long input_zero_point(void) { return ODD_INPUT0_ZERO_POINT; }\n"
        "long long output_zero_point(void) { return ODD_OUTPUT0_ZERO_POINT; }\n"
    )
    write_files(files, str(tmp_path))
    subprocess.run(
        [*compiler(), *STRICT_FLAGS, "-Werror=type-limits", "-c", "use.c", "odd.c"],
        cwd=tmp_path, check=True, capture_output=True,
    )


def small_plan():
    """y = relu(x) + x: x and relu(x) are alive together."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    h, y = b.tensor("h", (1, 4), "float32"), b.tensor("y", (1, 4), "float32")
    b.op("RELU", [x], [h])
    b.op("ADD", [h, x], [y])
    b.output(y)
    return plan_model(parse_model(b.build(), "small.tflite"))


def with_graph(mp, **changes):
    graph = dataclasses.replace(mp.graph, **changes)
    program = dataclasses.replace(mp.program, model=dataclasses.replace(mp.model, graphs=(graph,)))
    return dataclasses.replace(mp, program=program)


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"outputs": ()}, ModelError, "the graph has no outputs"),
        ({"inputs": ()}, UnsupportedOpError, "the graph has no inputs"),
        ({"outputs": (2, 3)}, ModelError, "graph output 1 is tensor 3"),
    ],
    ids=["no-outputs", "no-inputs", "output-nobody-writes"],
)
def test_graphs_without_c_are_refused(change, error, words):
    mp = small_plan()
    if "outputs" in change and 3 in change["outputs"]:  # a tensor no operator writes
        lonely = dataclasses.replace(mp.graph.tensors[2], index=3, name="lonely")
        mp = with_graph(mp, tensors=(*mp.graph.tensors, lonely))
    with pytest.raises(error) as raised:
        generate(with_graph(mp, **change), "m")
    assert words in raised.value.message and raised.value.source == "small.tflite"
    assert str(raised.value).count("\n") == 0


def test_a_constant_graph_input_is_refused():
    mp = with_tensor(small_plan(), 0, data=np.zeros((1, 4), np.float32))
    with pytest.raises(ModelError, match="graph input 0 is tensor 0 .* a constant"):
        generate(mp, "m")


def test_an_unsafe_plan_is_refused():
    mp = small_plan()
    assert len(mp.plan.offsets) >= 2
    unsafe = dataclasses.replace(mp.plan, offsets=(0,) * len(mp.plan.offsets))
    with pytest.raises(PlanError, match="unsafe plan: buffers .* share bytes") as raised:
        generate(dataclasses.replace(mp, plan=unsafe), "m")
    assert raised.value.source == "small.tflite"


def test_a_plan_for_other_buffers_is_refused():
    """Safe in itself, but its buffers are smaller than the graph's tensors."""
    mp = small_plan()
    shrunk = tuple(dataclasses.replace(b, size=4) for b in mp.plan.buffers)
    plan = dataclasses.replace(mp.plan, buffers=shrunk)
    with pytest.raises(PlanError, match="sizes or lives. are not the ones this graph needs"):
        generate(dataclasses.replace(mp, plan=plan), "m")


# --- the escaping itself --------------------------------------------------------------------

TRICKY = "*/\\?\"'\n\t\x00\x1b\x7f\x85\xa0é中😀\u202e\u2066\ufeffab01x"


def tricky_strings(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(rng.choice(TRICKY) for _ in range(rng.randrange(1, 24))) for _ in range(count)
    ] + HOSTILE


def test_escaped_text_is_printable_ascii_without_comment_or_trigraph_marks():
    for text in tricky_strings(500):
        spelled = c_text(text)
        assert all(" " <= c <= "~" for c in spelled), spelled
        assert "*/" not in spelled and "/*" not in spelled and "??" not in spelled, spelled
        assert not re.search(r"(?<!\\)[\"']", spelled), spelled  # quotes only as escapes
        assert not spelled.endswith("\\") and len(spelled) <= 64, spelled


def test_escaped_text_is_inert_in_comments_and_exact_in_string_literals(tmp_path):
    """One program holds every spelling in a block comment, a line comment and a string
    literal: it compiles with -Werror and prints back the original UTF-8 of each."""
    texts = tricky_strings(300, seed=1)
    lines = ["#include <stdio.h>", "int main(void) {"]
    for text in texts:
        spelled = c_text(text, limit=10_000)
        literal = f'"{spelled}"'
        lines += [f"  /* {spelled} */", f"  // {spelled}",
                  f"  fwrite({literal}, 1, sizeof {literal} - 1, stdout);"]
    lines += ["  return 0;", "}"]
    (tmp_path / "t.c").write_text("\n".join(lines) + "\n")
    subprocess.run([*compiler(), *STRICT_FLAGS, "t.c", "-o", "t"], cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, check=True).stdout
    assert out == "".join(texts).encode()


def test_long_text_is_cut_with_a_marker():
    spelled = c_text("a" * 100)
    assert spelled == "a" * 61 + "..."
    assert c_text("\u202e" * 30).endswith("...") and len(c_text("\u202e" * 30)) <= 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model", "model"),
        ("my-net.v2", "my_net_v2"),
        ("9lives", "m_9lives"),
        ("_private", "m__private"),
        ("int", "m_int"),
        ("é中", "m___"),
        ("", "model"),
        ("*/x", "m___x"),
    ],
)
def test_identifiers_are_always_valid_c(text, expected):
    assert c_identifier(text) == expected


def test_identifiers_are_capped_and_never_keywords():
    for text in ["x" * 100, "9" * 100, *C_KEYWORDS, *HOSTILE]:
        name = c_identifier(text)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name), name
        assert len(name) <= C_IDENTIFIER_LIMIT and name not in C_KEYWORDS


# --- all files of one gen, or none ----------------------------------------------------------

FILES = {"m.h": "header\n", "m.c": "source\n", "m_main.c": "harness\n"}


def test_gen_files_appear_together_in_a_new_directory(tmp_path):
    target = tmp_path / "new" / "deeper"
    paths = write_files_atomic(str(target), FILES)
    assert paths == [str(target / name) for name in FILES]
    assert {p.name: p.read_text() for p in target.iterdir()} == FILES
    assert sorted(os.listdir(tmp_path)) == ["new"]  # no staging folder left over


def test_gen_files_replace_their_own_and_keep_the_rest(tmp_path):
    (tmp_path / "m.c").write_text("old source\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    write_files_atomic(str(tmp_path), FILES)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {**FILES, "notes.txt": "mine\n"}


def test_a_failed_write_leaves_the_previous_files(tmp_path, monkeypatch):
    (tmp_path / "m.h").write_text("old header\n")
    (tmp_path / "m.c").write_text("old source\n")
    real_replace = os.replace

    def failing_replace(src, dst):
        if os.path.basename(dst) == "m_main.c":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(ArenacError, match="cannot write"):
        write_files_atomic(str(tmp_path), FILES)
    monkeypatch.undo()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "m.h": "old header\n", "m.c": "old source\n"
    }


def test_a_failed_write_leaves_no_new_directory(tmp_path):
    (tmp_path / "blocker").write_text("a file, not a directory\n")
    with pytest.raises(ArenacError, match="cannot write"):
        write_files_atomic(str(tmp_path / "blocker" / "out"), FILES)
    assert sorted(os.listdir(tmp_path)) == ["blocker"]


def test_compiled_names_of_every_file_come_from_the_identifier(tmp_path):
    files = generate(small_plan(), "*/ evil name\n")
    assert sorted(files) == ["m____evil_name_.c", "m____evil_name_.h", "m____evil_name__main.c"]
    write_files(files, str(tmp_path))
    compile_files(str(tmp_path), "m____evil_name_")


def external_io_outputs(data: bytes, directory) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """runtime_py's outputs and those of the C built with --external-io, on the same inputs."""
    model = parse_model(data, "outputs.tflite")
    inputs = random_inputs(model.main, 0)
    expected = ArenaInterpreter(plan_model(model)).invoke(inputs)
    write_files(generate(plan_model(model, external_io=True), "model", external_io=True),
                str(directory))
    binary = compile_files(str(directory), "model")
    raw = subprocess.run([binary], input=b"".join(v.tobytes() for v in inputs),
                         capture_output=True, check=True).stdout
    return expected, split_outputs(raw, model.main, 1)[0]


def with_outputs(pick) -> bytes:
    model = fb.ModelT.InitFromPackedBuf(EXAMPLES["tiny_cnn_float32"](), 0)
    graph = model.subgraphs[0]
    graph.outputs = pick(graph)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@pytest.mark.parametrize("pick", [
    lambda g: [g.outputs[0], g.outputs[0]],  # one tensor listed twice
    lambda g: [g.outputs[0], g.operators[0].inputs[2]],  # a constant the first conv reads
    lambda g: [g.outputs[0], g.inputs[0]],  # the graph input itself
], ids=["repeated", "constant", "input"])
def test_external_io_fills_every_output_buffer(pick, tmp_path):
    """Fuzzing findings: with --external-io, outputs no kernel writes were left unwritten, and
    a constant output made the kernels read the caller's buffer instead of flash."""
    expected, actual = external_io_outputs(with_outputs(pick), tmp_path)
    assert len(actual) == len(expected) == 2
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5)  # float32 sums in another order
