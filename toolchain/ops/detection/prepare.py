"""TFLite_Detection_PostProcess: params every backend runs from, and the kernel's scratch.

The output stage of TFLite's SSD detection models: box encodings (centre and size, relative to
anchors) decoded into corners, then non-maximum suppression over the class scores, fast
(each box by its best classes, one suppression) or regular (one suppression per class, then
the best overall). We follow LiteRT's kernel step by step: the decoding in double, rounded to
float as it stores; the scores kept at or above the threshold; a stable sort of them by
descending score; suppression when the intersection over union, in float, exceeds its
threshold. Fast suppression ranks each box's classes as LiteRT does: the first maximum for
one, libstdc++'s std::partial_sort for several (whose order among equal scores LiteRT's
outputs show). Regular suppression keeps min(detections_per_class, max_detections) per class
and merges each class's into the best so far as LiteRT 2 does (std::inplace_merge: on equal
scores the earlier first), single-threaded as our oracle runs it.

uint8 encodings (with uint8 anchors) and uint8 scores are dequantized first, as LiteRT does;
float32 ones are read as they are. The outputs are float32: boxes [1, D, 4], classes [1, D],
scores [1, D] and the number of detections [1], D = max_detections x
max_classes_per_detection. Where LiteRT leaves output entries unwritten (fast suppression
with fewer detections than D), ours are 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import MemoryRequest, required_input

OPTIONS_FLOAT = ("nms_score_threshold", "nms_iou_threshold", "y_scale", "x_scale", "h_scale",
                 "w_scale")
OPTIONS_INT = ("max_detections", "num_classes")
DETECTIONS_PER_CLASS = 100  # LiteRT's default when the option is absent
BOX = 4  # coordinates of a box


@dataclass(frozen=True)
class Dequantized:
    """A uint8 input read as (float(q) - zero_point) * scale, in float."""

    scale: float
    zero_point: int


@dataclass(frozen=True)
class DetectionParams:
    num_boxes: int
    encoding: int  # values per box encoding (4, or more: only the first 4 are read)
    num_classes: int
    with_background: int  # scores per box: num_classes, or one more for the background
    max_detections: int
    classes_per_detection: int  # max_classes_per_detection (fast suppression)
    detections_per_class: int  # regular suppression: at most max_detections, as LiteRT takes it
    regular: bool
    score_threshold: float  # float32 values
    iou_threshold: float
    scales: tuple[float, float, float, float]  # y, x, h, w (float32 values)
    boxes: Dequantized | None  # how box encodings and anchors are read (None: float32)
    anchors: Dequantized | None
    scores: Dequantized | None

    @property
    def label_offset(self) -> int:
        return self.with_background - self.num_classes

    @property
    def detections(self) -> int:
        """D, the output's entries: max_detections x max_classes_per_detection."""
        return self.max_detections * self.classes_per_detection

    @property
    def top_classes(self) -> int:
        """The classes fast suppression keeps per box."""
        return min(self.classes_per_detection, self.num_classes)


def _dequantized(t: Tensor) -> Dequantized | None:
    if t.dtype == "float32":
        return None
    q = t.quantization
    if q is None or len(q.scale) != 1:
        raise UnsupportedOpError(f"uint8 '{t.name}' without one scale and zero point")
    return Dequantized(float(np.float32(q.scale[0])), int(q.zero_point[0]))


def _options(op: Operator) -> dict:
    options = dict(op.options)
    missing = [k for k in (*OPTIONS_FLOAT, *OPTIONS_INT, "max_classes_per_detection")
               if k not in options]
    if missing:
        raise ModelError(f"custom options lack {', '.join(missing)}")
    for key in (*OPTIONS_INT, "max_classes_per_detection", "detections_per_class"):
        value = options.get(key, DETECTIONS_PER_CLASS)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
            raise ModelError(f"option {key}={value!r} is not a count")
    for key in OPTIONS_FLOAT:
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise ModelError(f"option {key}={value!r} is not a finite number")
    return options


def prepare_detection_postprocess(graph: Graph, op: Operator) -> DetectionParams:
    """LiteRT's Prepare and the checks its Eval makes of constants, made once here."""
    boxes = required_input(graph, op, 0, "box encodings")
    scores = required_input(graph, op, 1, "class predictions")
    anchors = required_input(graph, op, 2, "anchors")
    options = _options(op)
    if len(boxes.shape) != 3 or len(scores.shape) != 3 or len(anchors.shape) != 2:
        raise ModelError("box encodings and class predictions need 3 dimensions, anchors 2")
    if boxes.shape[0] != 1 or scores.shape[0] != 1:
        raise UnsupportedOpError("a batch other than 1 (LiteRT's kernel takes one)")
    num_boxes, encoding = boxes.shape[1], boxes.shape[2]
    num_classes, with_background = int(options["num_classes"]), scores.shape[2]
    if encoding < BOX or scores.shape[1] != num_boxes or anchors.shape != (num_boxes, BOX):
        raise ModelError(f"box encodings {list(boxes.shape)}, class predictions "
                         f"{list(scores.shape)} and anchors {list(anchors.shape)} do not match")
    if not 0 <= with_background - num_classes <= 1:
        raise ModelError(f"{with_background} scores per box for {num_classes} classes")
    if (boxes.dtype == "uint8") != (anchors.dtype == "uint8"):
        raise UnsupportedOpError(f"{boxes.dtype} box encodings with {anchors.dtype} anchors "
                                 "(LiteRT reads both float32 or both uint8)")
    iou = float(np.float32(options["nms_iou_threshold"]))
    if not 0.0 < iou <= 1.0:
        raise ModelError(f"nms_iou_threshold {iou} outside (0, 1]")
    regular = bool(options.get("use_regular_nms", False))
    per_class = int(options.get("detections_per_class", DETECTIONS_PER_CLASS))
    classes_per_detection = int(options["max_classes_per_detection"])
    if num_classes < 1:
        raise UnsupportedOpError("no classes (LiteRT's kernel reads a score that is not there)")
    if regular and min(per_class, int(options["max_detections"])) < 1:
        raise UnsupportedOpError("regular suppression of no detections (LiteRT fails on it)")
    if not regular and classes_per_detection < 1:
        raise ModelError("max_classes_per_detection must be positive for fast suppression")
    params = DetectionParams(
        num_boxes, encoding, num_classes, with_background, int(options["max_detections"]),
        classes_per_detection, min(per_class, int(options["max_detections"])), regular,
        float(np.float32(options["nms_score_threshold"])), iou,
        tuple(float(np.float32(options[k])) for k in ("y_scale", "x_scale", "h_scale",
                                                        "w_scale")),
        _dequantized(boxes), _dequantized(anchors), _dequantized(scores))
    _check_outputs(graph, op, params)
    return params


def _check_outputs(graph: Graph, op: Operator, p: DetectionParams) -> None:
    shapes = [(1, p.detections, BOX), (1, p.detections), (1, p.detections), (1,)]
    if len(op.outputs) != 4:
        raise ModelError(f"has {len(op.outputs)} outputs, not 4")
    for t, shape in zip(op.outputs, shapes, strict=True):
        tensor = graph.tensors[t]
        if tensor.dtype != "float32" or tensor.shape != shape:
            raise ModelError(f"output '{tensor.name}' is {tensor.dtype}{list(tensor.shape)}, "
                             f"not float32{list(shape)}")


@dataclass(frozen=True)
class ScratchLayout:
    """Where each working array lies in the kernel's one scratch buffer (byte offsets, each
    4-aligned), and how many elements it holds."""

    parts: tuple[tuple[str, str, int, int], ...]  # (name, C type, offset, count)
    size: int


def scratch_layout(p: DetectionParams) -> ScratchLayout:
    """The decoded boxes, the dequantized scores (uint8 scores only), and what suppression
    keeps: the candidates above the threshold, their order, the merge sort's second buffer,
    whether each is still active, and the regular path's detections so far and their merge
    with a class's, or the fast path's best classes of each box."""
    n, merged = p.num_boxes, 2 * p.max_detections
    wanted = [("decoded", "float", n * BOX)]
    if p.scores is not None:
        wanted.append(("scores", "float", n * p.with_background))
    wanted += [("keep", "int32_t", n), ("keep_scores", "float", n), ("order", "int32_t", n),
               ("merged", "int32_t", n), ("selected", "int32_t", n), ("active", "uint8_t", n)]
    if p.regular:
        wanted += [("class_scores", "float", n), ("found_classes", "int32_t", merged),
                   ("found_scores", "float", merged), ("merged_classes", "int32_t", merged),
                   ("merged_scores", "float", merged)]
    else:
        wanted += [("best_scores", "float", n), ("best_classes", "int32_t", n * p.top_classes)]
        if p.top_classes > 1:
            wanted.append(("class_order", "int32_t", p.num_classes))
    parts, offset = [], 0
    for name, ctype, count in wanted:
        parts.append((name, ctype, offset, count))
        offset += (count * (1 if ctype == "uint8_t" else 4) + 3) // 4 * 4
    return ScratchLayout(tuple(parts), offset)


def detection_scratch(p: DetectionParams) -> tuple[MemoryRequest, ...]:
    return (MemoryRequest(scratch_layout(p).size, "decoded boxes and suppression lists"),)
