"""TFLite_Detection_PostProcess (toolchain/ops/detection): runtime_py in its planned arena and the
C (under the sanitizers) against LiteRT's kernel, every output bit for bit, on float32 and uint8
inputs, fast and regular suppression, with scores that tie often (uint8 ones, and float ones
drawn from a few values) so that the orders LiteRT's sorts give equal scores are shown."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import fails_everywhere, refusal
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model

OP = "TFLite_Detection_PostProcess"


def detection_model(boxes: int, classes: int, options: dict, dtype: str = "float32",
                    score_dtype: str = "float32", background: int = 1, encoding: int = 4,
                    seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    quant = (0.05, 128) if dtype == "uint8" else (None, None)
    score_quant = (1 / 255, 0) if score_dtype == "uint8" else (None, None)
    encodings = b.input("box_encodings", (1, boxes, encoding), dtype, *quant)
    scores = b.input("class_predictions", (1, boxes, classes + background), score_dtype,
                     *score_quant)
    centres = rng.random((boxes, 2)) * 0.8 + 0.1
    sizes = rng.random((boxes, 2)) * 0.3 + 0.05
    anchors = np.concatenate([centres, sizes], axis=1)
    if dtype == "uint8":
        anchors_t = b.const("anchors", np.round(anchors / 0.01).astype(np.uint8), 0.01, 0)
    else:
        anchors_t = b.const("anchors", anchors.astype(np.float32))
    detections = options["max_detections"] * options["max_classes_per_detection"]
    outs = [b.tensor("detection_boxes", (1, detections, 4), "float32"),
            b.tensor("detection_classes", (1, detections), "float32"),
            b.tensor("detection_scores", (1, detections), "float32"),
            b.tensor("num_detections", (1,), "float32")]
    b.custom(OP, [encodings, scores, anchors_t], outs, options=options)
    for t in outs:
        b.output(t)
    return b.build()


def options(**changes) -> dict:
    return {"max_detections": 6, "max_classes_per_detection": 1, "detections_per_class": 4,
            "use_regular_nms": False, "nms_score_threshold": 0.3, "nms_iou_threshold": 0.4,
            "num_classes": 5, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0,
            "w_scale": 5.0, **changes}


def inputs_for(model: bytes, seed: int, levels: int | None = None) -> list[np.ndarray]:
    """Random inputs; float scores take one of `levels` values, so that many tie."""
    graph = parse_model(model, "<built model>").main
    rng = np.random.default_rng(seed)
    values = []
    for t in graph.inputs:
        tensor = graph.tensors[t]
        if tensor.dtype == "uint8":
            values.append(rng.integers(0, 256, tensor.shape).astype(np.uint8))
        elif tensor.name == "class_predictions" and levels:
            values.append((rng.integers(0, levels, tensor.shape) / levels).astype(np.float32))
        else:
            values.append((rng.standard_normal(tensor.shape) * 0.5).astype(np.float32))
    return values


def three_ways(model: bytes, input_sets: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of LiteRT, runtime_py and the sanitized C on each input set, the same
    bytes; returns LiteRT's. (The oracle zeroes its outputs before each invoke, so the entries
    LiteRT leaves unwritten read 0, as ours writes them.)"""
    oracle = LiteRTOracle(model)
    mp = plan_model(parse_model(model, "<built model>"))
    expected = [oracle.invoke(inputs) for inputs in input_sets]
    mine = [ArenaInterpreter(mp).invoke(inputs) for inputs in input_sets]
    with CBackend(mp, sanitize=True) as backend:
        c_outputs = backend.invoke_many(input_sets)
    for k, (e, m, c) in enumerate(zip(expected, mine, c_outputs, strict=True)):
        for name, a, b, d in zip(("boxes", "classes", "scores", "count"), e, m, c, strict=True):
            assert a.tobytes() == b.tobytes() == d.tobytes(), (k, name, a, b, d)
    return expected


CASES = {
    "fast": options(),
    "fast_three_classes_each": options(max_classes_per_detection=3),
    "fast_more_classes_than_there_are": options(max_classes_per_detection=7, num_classes=4),
    "regular": options(use_regular_nms=True),
    "regular_one_detection": options(use_regular_nms=True, max_detections=1),
    "regular_two_classes_each": options(use_regular_nms=True, max_classes_per_detection=2),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype, score_dtype", [("float32", "float32"), ("uint8", "uint8"),
                                                ("float32", "uint8")])
def test_detection_postprocess(name, dtype, score_dtype):
    o = CASES[name]
    model = detection_model(40, o["num_classes"], o, dtype, score_dtype)
    sets = [inputs_for(model, seed, levels=8) for seed in range(4)]
    expected = three_ways(model, sets)
    wanted = min(2, o["max_detections"])
    assert any(out[3][0] >= wanted for out in expected), f"no input set detects {wanted} boxes"


def test_no_background_class_and_longer_encodings():
    o = options(use_regular_nms=True, num_classes=3)
    model = detection_model(25, 3, o, background=0, encoding=6)
    three_ways(model, [inputs_for(model, seed) for seed in range(3)])


def test_no_box_above_the_threshold_detects_nothing():
    o = options(nms_score_threshold=2.0)
    model = detection_model(10, 5, o)
    (out,) = three_ways(model, [inputs_for(model, 0)])
    assert out[3][0] == 0 and not out[0].any()


def test_a_box_that_ends_before_it_starts_fails_the_invoke():
    """A negative anchor height decodes upside down: LiteRT fails the invoke, runtime_py
    raises and the C's invoke returns NAME_ERROR_INVALID_BOXES (the harness exits 3)."""
    b = ModelBuilder()
    encodings = b.input("box_encodings", (1, 2, 4), "float32")
    scores = b.input("class_predictions", (1, 2, 3), "float32")
    anchors = b.const("anchors", np.array([[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, -0.2, 0.2]],
                                          np.float32))
    outs = [b.tensor("boxes", (1, 2, 4), "float32"), b.tensor("classes", (1, 2), "float32"),
            b.tensor("scores", (1, 2), "float32"), b.tensor("count", (1,), "float32")]
    b.custom(OP, [encodings, scores, anchors], outs,
             options=options(max_detections=2, num_classes=2))
    for t in outs:
        b.output(t)
    model = b.build()
    inputs = [np.zeros((1, 2, 4), np.float32), np.full((1, 2, 3), 0.9, np.float32)]
    fails_everywhere(model, inputs, "ends before it starts")


def test_the_scratch_is_planned_in_the_arena():
    o = options(use_regular_nms=True)
    mp = plan_model(parse_model(detection_model(40, 5, o, "uint8", "uint8"), "m"))
    (request,) = mp.program.scratch()
    # decoded boxes and dequantized scores alone: 40 x 4 and 40 x 6 floats
    assert request.size > 4 * (40 * 4 + 40 * 6)
    assert mp.arena_bytes >= request.size


@pytest.mark.parametrize("change, reason", [
    ({"nms_iou_threshold": 0.0}, "nms_iou_threshold 0.0 outside (0, 1]"),
    ({"max_classes_per_detection": 0}, "max_classes_per_detection must be positive"),
    ({"y_scale": float("inf")}, "not a finite number"),
])
def test_options_no_kernel_could_run_are_refused(change, reason):
    from toolchain.errors import ModelError

    with pytest.raises(ModelError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        plan_model(parse_model(detection_model(4, 2, options(num_classes=2, **change)), "m"))


def test_a_missing_option_is_refused():
    from toolchain.errors import ModelError

    o = options(num_classes=2)
    del o["h_scale"]
    with pytest.raises(ModelError, match="custom options lack h_scale"):
        plan_model(parse_model(detection_model(4, 2, o), "m"))


def test_int8_encodings_are_not_run():
    model = detection_model(4, 2, options(num_classes=2), "float32", "float32")
    b = ModelBuilder()
    e = b.input("box_encodings", (1, 4, 4), "int8", 0.05, 0)
    s = b.input("class_predictions", (1, 4, 3), "float32")
    a = b.const("anchors", np.ones((4, 4), np.int8), 0.01, 0)
    outs = [b.tensor("boxes", (1, 6, 4), "float32"), b.tensor("classes", (1, 6), "float32"),
            b.tensor("scores", (1, 6), "float32"), b.tensor("count", (1,), "float32")]
    b.custom(OP, [e, s, a], outs, options=options(num_classes=2))
    for t in outs:
        b.output(t)
    assert model and "int8" in refusal(b.build())
