"""The reader's work is proportional to the file: references shared between flatbuffer slots,
and between a custom op's flexbuffer vectors, are refused in one line before they multiply it.

No test measures time: counters of tables and values read bound the work exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from flatbuffers import flexbuffers
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from tests import fuzz
from tests.ops.test_signal import custom_model, hann
from toolchain.errors import ModelError
from toolchain.front import reader
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb


def window_model(options: bytes | dict) -> bytes:
    """A SignalWindow (its kernel reads the option "shift") with these custom options."""
    return custom_model("SignalWindow", [((8,), "int16"), ((8,), "int16")], [((8,), "int16")],
                        options, {1: hann(8)})


def counted_calls(monkeypatch, owner: type, name: str) -> list[int]:
    """A one-item list counting the calls of method `name` of `owner` from now on."""
    count = [0]
    real = getattr(owner, name)

    def counting(self, *args):
        count[0] += 1
        return real(self, *args)

    monkeypatch.setattr(owner, name, counting)
    return count


@pytest.fixture
def values_read(monkeypatch) -> list[int]:
    """Counts the flexbuffer values the reader reads."""
    return counted_calls(monkeypatch, reader._Flexbuffer, "value")


# -- custom options ---------------------------------------------------------------------------


def test_a_flexbuffer_of_shared_vectors_is_refused_after_reading_less_than_its_size(values_read):
    """4 references to the previous vector, 13 levels: 4**13 values from 142 bytes."""
    options = fuzz.shared_flexbuffer(4, 13)
    with pytest.raises(ModelError) as refused:
        parse_model(window_model(options), "bomb.tflite")
    assert str(refused.value) == (
        "bomb.tflite: subgraph 0 operator 0 (CUSTOM) custom options: the 142-byte flexbuffer "
        "declares more values than it holds (shared references or false lengths)"
    )
    assert len(options) == 142 and 0 < values_read[0] <= len(options)


@pytest.mark.parametrize("in_map", [False, True])
def test_a_false_length_is_refused_before_its_values_are_read(values_read, in_map):
    with pytest.raises(ModelError, match="declares more values than it holds"):
        parse_model(window_model(fuzz.long_flexbuffer(2**31 - 1, in_map)), "long.tflite")
    assert values_read[0] <= 1


def test_nesting_past_the_limit_is_refused_in_one_line():
    limit = reader.MAX_OPTIONS_DEPTH  # the options map is the first level
    with pytest.raises(ModelError, match=f"operator 0 .* nests deeper than {limit} levels$"):
        parse_model(window_model(fuzz.deep_flexbuffer(limit - 1)), "deep.tflite")
    with pytest.raises(ModelError, match=f"nests deeper than {limit} levels$"):
        parse_model(window_model(fuzz.deep_flexbuffer(5000)), "deep.tflite")
    value = parse_model(window_model(fuzz.deep_flexbuffer(limit - 2))).main.operators[0]
    nested = value.options["shift"]
    for _ in range(limit - 2):
        (nested,) = nested
    assert nested == (0,)


def test_vectors_that_share_nothing_are_read_whole():
    options = {"shift": 3, "window": [[1, 2], [3, 4]], "name": "hann", "scale": 0.5}
    op = parse_model(window_model(options)).main.operators[0]
    assert dict(op.options) == {"shift": 3, "window": ((1, 2), (3, 4)), "name": "hann",
                                "scale": 0.5}


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                    st.floats(-1e6, 1e6, width=32), st.text(max_size=8))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=6), inner, max_size=3),
    max_leaves=12,
)


def tuples(value):
    """flexbuffers.Loads's lists as the reader's tuples."""
    if isinstance(value, list | tuple):
        return tuple(tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: tuples(v) for k, v in value.items()}
    return value


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.filter_too_much])
@given(options=st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=8), VALUES,
                               max_size=6))
def test_options_read_as_flexbuffers_loads_reads_them(options):
    try:
        raw = bytes(flexbuffers.Dumps(options))
    except RuntimeError:  # maps Dumps itself writes wrongly
        reject()
    op = parse_model(window_model(raw)).main.operators[0]
    assert dict(op.options) == tuples(flexbuffers.Loads(raw))


# -- shared flatbuffer tables ----------------------------------------------------------------


def many_subgraphs(count: int) -> bytes:
    """`count` subgraphs, the first with `count` tensors."""
    b = ModelBuilder("float32")
    for i in range(count):
        b.tensor(f"t{i}", (1, 2, 3, 4), "float32")
    b.output(0)
    for i in range(1, count):
        b.subgraph(f"g{i}").tensor("t", (1,), "float32")
    return b.build()


def shared(data: bytes, *vectors: str) -> bytes:
    """Every slot of each named vector of tables points at its first table."""
    slots = {what: (start, length) for what, start, length in fuzz.table_vectors(data)}
    for what in vectors:
        data = fuzz.point_slots_at_first(data, *slots[what])
    return data


@pytest.fixture
def tensors_read(monkeypatch) -> list[int]:
    """Counts the tensor tables the reader reads."""
    return counted_calls(monkeypatch, reader._Parser, "tensor")


def test_subgraphs_sharing_a_subgraph_of_shared_tensors_are_refused(tensors_read):
    """300 subgraph slots at one subgraph whose 300 tensor slots point at one tensor: 90,000
    tensors to read from a file that holds 300."""
    data = shared(many_subgraphs(300), "subgraph", "subgraph 0 tensor")
    with pytest.raises(ModelError) as refused:
        parse_model(data, "shared.tflite")
    assert str(refused.value).startswith("shared.tflite: corrupt flatbuffer (entries share their "
                                         "tables: with tensor ")
    assert str(refused.value).endswith(f"more than the file's {len(data)} bytes)")
    assert tensors_read[0] <= len(data) // 4  # each tensor read is charged its 4-byte slot


def test_operators_sharing_one_operator_are_charged_each_time():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    inputs = [x] * 2000
    for i in range(200):
        out = b.tensor(f"y{i}", (1, 4), "float32")
        b.op("ADD", inputs[:2] if i else inputs, [out])
    b.output(out)
    data = shared(b.build(), "subgraph 0 operator")
    with pytest.raises(ModelError, match="entries share their tables: with subgraph 0 operator"):
        parse_model(data, "ops.tflite")


def test_the_reference_models_read_less_than_their_size():
    """What the budget allows: every slot and string of a converter's file lies in bytes of
    its own."""
    from tests.conftest import SHARED_MODEL_FILES
    from toolchain.front.examples import EXAMPLES

    files = {path.name: path.read_bytes() for path in SHARED_MODEL_FILES}
    files.update({name: build() for name, build in EXAMPLES.items()})
    for name, data in files.items():
        parser = reader._Parser(data, name)
        parser.model()
        assert 0 < parser.unread < len(data), name


def test_buffer_slots_sharing_one_buffer_are_refused():
    """`embed` copies every buffer entry through the object API: 300 entries at one 4 KiB
    buffer would copy 1.2 MB from a 6 KB file, so the reader charges each entry's bytes."""
    b = ModelBuilder("float32")
    b.output(b.fully_connected(b.input("x", (1, 4), "float32"), 3))
    model = fb.ModelT.InitFromPackedBuf(b.build(), 0)
    weights = fb.BufferT()
    weights.data = np.arange(4096, dtype=np.uint8)
    model.buffers = [weights, *model.buffers, *(fb.BufferT() for _ in range(300))]
    for tensor in model.subgraphs[0].tensors:  # the big buffer went first
        tensor.buffer += 1
    data = shared(fuzz.pack(model), "buffer")
    with pytest.raises(ModelError, match="share their tables: with buffers"):
        parse_model(data, "m.tflite")
    assert parse_model(fuzz.pack(model), "m.tflite")  # the same entries, each its own
