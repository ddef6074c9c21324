"""Whole models shaped as converters write them, through `arenac check` with every backend:
LiteRT's reference kernels against runtime_py, the sanitized host C and the C on a Cortex-M4
under QEMU.

- detection: an int8 backbone with a box head and a class head, DEQUANTIZE to float, and the
  TFLite_Detection_PostProcess output stage every TFLite SSD model ends in;
- pose: a float backbone whose heat map's peak is found per keypoint (ARG_MAX), turned into a
  row and a column (FLOOR_DIV, FLOOR_MOD on int32), the offsets there gathered (GATHER_ND) and
  their length taken (SQUARE, SUM, SQRT), as PoseNet-style decoders do in the graph.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.lab import qemu_backend

GRID = 6  # the feature map's rows and columns


def detection_model() -> bytes:
    b = ModelBuilder("int8", seed=4)
    image = b.input("image", (1, 12, 12, 3), "int8", 1 / 128, 0)
    features = b.conv_2d(image, 8, 3, stride=2, activation="RELU6")
    anchors_per_cell, classes = 2, 3
    boxes = GRID * GRID * anchors_per_cell
    box_head = b.reshape(b.conv_2d(features, 4 * anchors_per_cell, 1), (1, boxes, 4))
    logits = b.reshape(b.conv_2d(features, (classes + 1) * anchors_per_cell, 1),
                       (1, boxes, classes + 1))
    scores = b.tensor("scores", (1, boxes, classes + 1), "int8", 1 / 256, -128)
    b.op("LOGISTIC", [logits], [scores])
    float_boxes = b.tensor("box_encodings", (1, boxes, 4), "float32")
    float_scores = b.tensor("class_predictions", (1, boxes, classes + 1), "float32")
    b.op("DEQUANTIZE", [box_head], [float_boxes])
    b.op("DEQUANTIZE", [scores], [float_scores])
    cells = (np.arange(GRID) + 0.5) / GRID
    y, x = np.meshgrid(cells, cells, indexing="ij")
    sizes = np.array([[0.2, 0.2], [0.35, 0.2]])
    anchors = np.array([[cy, cx, h, w] for cy, cx in zip(y.ravel(), x.ravel(), strict=True)
                        for h, w in sizes], np.float32)
    anchors_t = b.const("anchors", anchors)
    detections = 5
    outputs = [b.tensor("detection_boxes", (1, detections, 4), "float32"),
               b.tensor("detection_classes", (1, detections), "float32"),
               b.tensor("detection_scores", (1, detections), "float32"),
               b.tensor("num_detections", (1,), "float32")]
    options = {"max_detections": detections, "max_classes_per_detection": 1,
               "detections_per_class": 10, "use_regular_nms": False,
               "nms_score_threshold": 0.35, "nms_iou_threshold": 0.5, "num_classes": classes,
               "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}
    b.custom("TFLite_Detection_PostProcess", [float_boxes, float_scores, anchors_t], outputs,
             options=options)
    for t in outputs:
        b.output(t)
    return b.build()


def pose_model() -> bytes:
    b = ModelBuilder("float32", seed=5)
    keypoints = 4
    image = b.input("image", (1, 12, 12, 3), "float32")
    features = b.conv_2d(image, 8, 3, stride=2, activation="RELU")
    heat = b.reshape(b.conv_2d(features, keypoints, 1), (1, GRID * GRID, keypoints))
    offsets = b.reshape(b.conv_2d(features, 2 * keypoints, 1), (GRID, GRID, 2 * keypoints))
    peak = b.tensor("peak", (1, keypoints), "int32")
    b.op("ARG_MAX", [heat, b.const("axis", np.array([1], np.int32))], [peak],
         {"output_type": "INT32"})
    width = b.const("width", np.array([GRID], np.int32))
    row, column = b.tensor("row", (1, keypoints), "int32"), b.tensor("column", (1, keypoints),
                                                                     "int32")
    b.op("FLOOR_DIV", [peak, width], [row])
    b.op("FLOOR_MOD", [peak, width], [column])
    cells = b.tensor("cells", (1, keypoints, 2), "int32")
    b.op("PACK", [row, column], [cells], {"values_count": 2, "axis": 2})
    at = b.tensor("offsets_at_peaks", (1, keypoints, 2 * keypoints), "float32")
    b.op("GATHER_ND", [offsets, cells], [at])
    squared = b.tensor("squared", (1, keypoints, 2 * keypoints), "float32")
    b.op("SQUARE", [at], [squared])
    total = b.tensor("total", (1, keypoints), "float32")
    b.op("SUM", [squared, b.const("last", np.array([-1], np.int32))], [total],
         {"keep_dims": False})
    length = b.tensor("offset_length", (1, keypoints), "float32")
    b.op("SQRT", [total], [length])
    for t in (row, column, length):
        b.output(t)
    return b.build()


# The int8-input model also runs its C under the sanitizers on the inputs' edge values; the
# float one does not: where FLT_MAX meets its float32 convolution, runtime_py's float64 sums
# and the C's float32 ones make different infinities and NaNs (docs/runtime_py.md).
MODELS = {"detection": (detection_model, ["--sanitize"]), "pose": (pose_model, [])}


@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
@pytest.mark.parametrize("name", MODELS)
def test_converter_shaped_model_checks_on_every_backend(name, tmp_path, capsys):
    path = tmp_path / f"{name}.tflite"
    build, flags = MODELS[name]
    path.write_bytes(build())
    code = main(["check", str(path), "--backends", "runtime_py,c,qemu", *flags, "--inputs", "3",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["backends"] == ["litert-ref", "runtime_py", "c", "qemu"]
