"""Lifetimes and model plans on small hand-made graphs with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from toolchain.errors import ModelError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lower.lifetimes import (
    SCRATCH,
    SHARED,
    STRIPE,
    TFLM_SCRATCH,
    BufferKey,
    ScratchRequest,
    compute_lifetimes,
)
from toolchain.lower.plan import NO_TECHNIQUES, plan_model
from toolchain.planners import Buffer


def chain_model():
    """Three float ops: x (400 B) -> a (800 B) -> c (1200 B) -> d (1200 B)."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 100), "float32")
    a = b.tensor("a", (1, 200), "float32")
    c = b.tensor("c", (1, 300), "float32")
    d = b.tensor("d", (1, 300), "float32")
    b.op("FULLY_CONNECTED", [x, b.const("w1", np.ones((200, 100), np.float32)), -1], [a])
    b.op("FULLY_CONNECTED", [a, b.const("w2", np.ones((300, 200), np.float32)), -1], [c])
    b.op("RELU", [c], [d])
    b.output(d)
    return parse_model(b.build(), "chain.tflite")


def residual_model():
    """x -> relu -> a; a -> relu6 -> r; add(a, r) -> y: a stays alive across the branch."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 64), "float32")
    a = b.tensor("a", (1, 64), "float32")
    r = b.tensor("r", (1, 64), "float32")
    y = b.tensor("y", (1, 64), "float32")
    unread = b.tensor("unread", (1, 64), "float32")
    b.op("RELU", [x], [a])
    b.op("RELU6", [a], [r])
    b.op("ADD", [a, r], [y])
    b.op("RELU", [r], [unread])
    b.output(y)
    return parse_model(b.build(), "residual.tflite")


def lives(model):
    lt = compute_lifetimes(model.main)
    names = [model.main.tensors[key.index].name for key in lt.keys]
    return {n: (b.size, b.first, b.last) for n, b in zip(names, lt.buffers, strict=True)}


def test_chain_lifetimes():
    assert lives(chain_model()) == {
        "x": (400, 0, 0),
        "a": (800, 0, 1),
        "c": (1200, 1, 2),
        "d": (1200, 2, 2),
    }


def test_residual_lifetimes_output_and_unread():
    assert lives(residual_model()) == {
        "x": (256, 0, 0),
        "a": (256, 0, 2),  # read by the ADD two ops later
        "r": (256, 1, 3),  # read last by op 3
        "y": (256, 2, 3),  # a graph output lives to the end of the graph
        "unread": (256, 3, 3),  # nobody reads it: only its producer's step
    }


def test_chain_plan_exact_numbers():
    model = chain_model()
    greedy = plan_model(model, "greedy", techniques=NO_TECHNIQUES)
    # Live sets: {x, a} = 1200 at op 0, {a, c} = 2000 at op 1, {c, d} = 2400 at op 2.
    assert greedy.lower_bound_bytes == 2400
    assert greedy.naive_bytes == 3600
    assert greedy.arena_bytes == 2400
    offsets = {model.main.tensors[r.tensor].name: r.offset for r in greedy.rows()}
    # Largest first: c at 0; d beside c; a beside c (d is not yet alive); x under c (c not alive).
    assert offsets == {"c": 0, "d": 1200, "a": 1200, "x": 0}
    assert plan_model(model, "naive", techniques=NO_TECHNIQUES).arena_bytes == 3600
    freelist = plan_model(model, "freelist", techniques=NO_TECHNIQUES)
    # a at 0 and x at 800; c takes x's freed top block and grows it; d finds no block: 2000 + 1200.
    assert freelist.arena_bytes == 3200
    # With in-place on, the RELU writes d over c as c dies: the peak is {a, c} = 2000 bytes.
    assert plan_model(model, "greedy").arena_bytes == 2000


def test_chain_order_seam_and_scratch():
    model = chain_model()
    lt = compute_lifetimes(model.main, order=[0, 1, 2],
                           scratch=[ScratchRequest(1, 96, "im2col", BufferKey(SCRATCH, 1))])
    assert lt.buffers[-1] == Buffer(id=4, size=96, first=1, last=1)
    assert lt.keys[-1] == BufferKey(SCRATCH, 1)
    with pytest.raises(ModelError, match="permutation"):
        compute_lifetimes(model.main, order=[0, 0, 2])
    with pytest.raises(ModelError, match="before anything writes it"):
        compute_lifetimes(model.main, order=[1, 0, 2])


def test_variables_and_constants_are_not_planned():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    s = b.variable("state", np.zeros((1, 4), np.float32))
    y = b.tensor("y", (1, 4), "float32")
    b.op("ADD", [x, s], [y])
    b.output(y)
    model = parse_model(b.build())
    lt = compute_lifetimes(model.main)
    assert lt.variables == (s,)
    assert s not in lt.tensor_buffers
    assert sorted(lt.tensor_buffers) == sorted([x, y])


def npu_model(reader: str = "ethos-u") -> bytes:
    """x -> an op (custom `reader`, or ADD) that also reads a tensor nothing writes -> y, as
    Vela writes its NPU op with the NPU's scratch as an input."""
    b = ModelBuilder()
    x = b.input("x", (1, 64), "int8", 0.1, 0)
    scratch = b.tensor("scratch", (1, 64 if reader == "ADD" else 300), "int8", 0.1, 0)
    y = b.tensor("y", (1, 64), "int8", 0.1, 0)
    if reader == "ADD":
        b.op("ADD", [x, scratch], [y])
    else:
        b.custom(reader, [x, scratch], [y])
    b.output(y)
    return b.build()


def test_an_unwritten_input_of_an_op_without_kernel_is_its_working_memory(capsys, tmp_path):
    """planned as TFLite allocates it (from its first reader to its last), so `plan` shows the
    arena and the op without a kernel is the one line every other command gives."""
    from toolchain.cli import main

    model = npu_model()
    mp = plan_model(parse_model(model, "npu.tflite"), "greedy")
    scratch = mp.lifetimes.buffers[mp.lifetimes.tensor_buffers[1]]
    assert (scratch.size, scratch.first, scratch.last) == (300, 0, 0)
    assert mp.arena_bytes >= 64 + 64 + 300 - 64  # x, y and the scratch, y maybe over x
    path = tmp_path / "npu.tflite"
    path.write_bytes(model)
    assert main(["plan", str(path)]) == 0
    assert "ethos-u" in capsys.readouterr().out
    assert main(["gen", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ethos-u" in err[0] and "before anything writes it" not in err[0]
    assert not (tmp_path / "out").exists()


def test_an_op_with_a_kernel_reading_what_nothing_writes_is_refused():
    with pytest.raises(ModelError, match=r"reads tensor 1 \('scratch'\) before anything writes"):
        plan_model(parse_model(npu_model("ADD"), "m.tflite"))


def test_ops_that_take_turns_share_one_scratch_buffer():
    """A group's kernel scratch is one buffer as large as the most one op asks for (its
    requests laid `alignment` apart); stripe rows, TFLM's scratch and a group with one op of
    scratch keep their own buffers."""
    graph = chain_model().graphs[0]

    def request(op: int, size: int, slot: int = 0, kind: str = SCRATCH) -> ScratchRequest:
        return ScratchRequest(op, size, "work", BufferKey(kind, op, slot))

    scratch = [request(0, 100), request(1, 30), request(1, 50, 1), request(2, 70),
               request(2, 900, kind=STRIPE), request(1, 500, kind=TFLM_SCRATCH)]
    lives = compute_lifetimes(graph, scratch=scratch, merged={1: 0, 2: 0},
                              share=[(0, 1, 2)], alignment=16)
    shared = BufferKey(SHARED, 0)
    assert [(r.op, r.size) for r in lives.shared] == [(0, 100)]  # op 1: 32 + 50 = 82
    assert lives.within == {scratch[0].key: (shared, 0), scratch[1].key: (shared, 0),
                            scratch[2].key: (shared, 32), scratch[3].key: (shared, 0)}
    assert lives.holder(scratch[2].key) == (lives.buffer_of[shared], 32)
    own = {scratch[4].key, scratch[5].key, shared}
    assert own <= set(lives.keys) and not set(lives.within) & set(lives.keys)
    assert lives.buffers[lives.buffer_of[shared]].size == 100
    # one op of scratch in the group: nothing to share
    alone = compute_lifetimes(graph, scratch=[request(0, 100), request(2, 900, kind=STRIPE)],
                              share=[(0, 1, 2)], alignment=16)
    assert not alone.shared and not alone.within
