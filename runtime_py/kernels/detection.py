"""numpy kernel of TFLite_Detection_PostProcess (toolchain.ops.detection), written from LiteRT's
kernel as plain loops: the decoding in double (Python floats, the C library's exp), every other
step in float32, and LiteRT's orders: a stable sort of the kept scores, the first largest or
libstdc++'s partial sort where fast suppression ranks a box's classes, a stable merge of each
class's detections in regular suppression."""

from __future__ import annotations

import math

import numpy as np

from toolchain.errors import RuntimeBackendError
from toolchain.ops.detection.prepare import Dequantized, DetectionParams

f32 = np.float32


def _read(values: np.ndarray, q: Dequantized | None) -> np.ndarray:
    if q is None:
        return values.astype(f32)
    return ((values.astype(f32) - f32(q.zero_point)) * f32(q.scale)).astype(f32)


def _decode(p: DetectionParams, encodings: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    boxes = _read(encodings.reshape(p.num_boxes, p.encoding)[:, :4], p.boxes)
    anchor = _read(anchors.reshape(p.num_boxes, 4), p.anchors)
    ys, xs, hs, ws = p.scales
    decoded = np.empty((p.num_boxes, 4), f32)
    for i in range(p.num_boxes):
        y, x, h, w = (float(v) for v in boxes[i])
        ay, ax, ah, aw = (float(v) for v in anchor[i])
        yc = f32(y / ys * ah + ay)
        xc = f32(x / xs * aw + ax)
        half_h = f32(0.5 * math.exp(h / hs) * ah)
        half_w = f32(0.5 * math.exp(w / ws) * aw)
        decoded[i] = (yc - half_h, xc - half_w, yc + half_h, xc + half_w)
    return decoded


def _iou(boxes: np.ndarray, i: int, j: int) -> f32:
    a, b = boxes[i], boxes[j]
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    if area_a <= 0 or area_b <= 0:
        return f32(0.0)
    ymin, xmin = max(a[0], b[0]), max(a[1], b[1])
    ymax, xmax = min(a[2], b[2]), min(a[3], b[3])
    overlap = max(ymax - ymin, f32(0.0)) * max(xmax - xmin, f32(0.0))
    return overlap / (area_a + area_b - overlap)


def _suppress(p: DetectionParams, boxes: np.ndarray, scores: np.ndarray, limit: int) -> list[int]:
    """LiteRT's NonMaxSuppressionSingleClassHelper."""
    keep = [i for i in range(p.num_boxes) if scores[i] >= f32(p.score_threshold)]
    order = sorted(range(len(keep)), key=lambda k: -float(scores[keep[k]]))  # stable
    active = [True] * len(keep)
    left, wanted, selected = len(keep), min(len(keep), limit), []
    for i in range(len(keep)):
        if left == 0 or len(selected) >= wanted:
            break
        if not active[i]:
            continue
        selected.append(keep[order[i]])
        active[i] = False
        left -= 1
        for j in range(i + 1, len(keep)):
            if active[j] and _iou(boxes, keep[order[i]], keep[order[j]]) > f32(p.iou_threshold):
                active[j] = False
                left -= 1
    return selected


def _half(n: int) -> int:
    """C's n / 2 (towards zero)."""
    return -((-n) // 2) if n < 0 else n // 2


def _adjust(values, heap: list[int], hole: int, length: int, value: int) -> None:
    """libstdc++'s __adjust_heap under comp(a, b) = values[a] > values[b]."""
    top, child = hole, hole
    while child < _half(length - 1):
        child = 2 * (child + 1)
        if values[heap[child]] > values[heap[child - 1]]:
            child -= 1
        heap[hole] = heap[child]
        hole = child
    if length % 2 == 0 and child == _half(length - 2):
        child = 2 * (child + 1)
        heap[hole] = heap[child - 1]
        hole = child - 1
    parent = _half(hole - 1)
    while hole > top and values[heap[parent]] > values[value]:
        heap[hole] = heap[parent]
        hole = parent
        parent = _half(hole - 1)
    heap[hole] = value


def _rank(values, n: int, count: int) -> list[int]:
    """LiteRT's DecreasingPartialArgSort: the first largest for one, else std::partial_sort."""
    if count == 1:
        best = 0
        for i in range(1, n):
            if values[i] > values[best]:
                best = i
        return [best]
    heap = list(range(n))
    for i in range(_half(count - 2), -1, -1):
        _adjust(values, heap, i, count, heap[i])
    for i in range(count, n):
        if values[heap[i]] > values[heap[0]]:
            value, heap[i] = heap[i], heap[0]
            _adjust(values, heap, 0, count, value)
    for i in range(count - 1, 0, -1):
        value, heap[i] = heap[i], heap[0]
        _adjust(values, heap, 0, i, value)
    return heap[:count]


def _regular(p: DetectionParams, boxes, scores) -> list[tuple[int, int, f32]]:
    """Each class's detections merged into the best so far as LiteRT 2 merges them
    (std::inplace_merge: on equal scores the earlier first), the best max_detections kept."""
    found: list[tuple[int, int, f32]] = []  # (box, class, score), best first
    for col in range(p.num_classes):
        class_scores = scores[:, col + p.label_offset]
        new = [(box, col, class_scores[box])
               for box in _suppress(p, boxes, class_scores, p.detections_per_class)]
        merged, a, b = [], 0, 0
        while a < len(found) and b < len(new):
            if new[b][2] > found[a][2]:
                merged.append(new[b])
                b += 1
            else:
                merged.append(found[a])
                a += 1
        found = (merged + found[a:] + new[b:])[:p.max_detections]
    return found


def _fast(p: DetectionParams, boxes, scores) -> list[list[tuple[int, int, f32]]]:
    columns = scores[:, p.label_offset:]
    best = [_rank(columns[i], p.num_classes, p.top_classes) for i in range(p.num_boxes)]
    best_scores = np.array([columns[i][best[i][0]] for i in range(p.num_boxes)], f32)
    return [[(box, cls, columns[box][cls]) for cls in best[box]]
            for box in _suppress(p, boxes, best_scores, p.max_detections)]


def detection_postprocess(p: DetectionParams, inputs, outputs) -> None:
    boxes = _decode(p, inputs[0], inputs[2])
    if ((boxes[:, 0] > boxes[:, 2]) | (boxes[:, 1] > boxes[:, 3])).any():
        raise RuntimeBackendError("TFLite_Detection_PostProcess: a decoded box ends before it "
                                  "starts")
    scores = _read(inputs[1].reshape(p.num_boxes, p.with_background), p.scores)
    out_boxes = np.zeros((p.detections, 4), f32)
    out_classes, out_scores = np.zeros(p.detections, f32), np.zeros(p.detections, f32)
    if p.regular:
        rows = [[entry] for entry in _regular(p, boxes, scores)]
        stride = 1
    else:
        rows, stride = _fast(p, boxes, scores), p.classes_per_detection
    for i, row in enumerate(rows):
        for col, (box, cls, score) in enumerate(row):
            out_boxes[stride * i + col] = boxes[box]
            out_classes[stride * i + col] = cls
            out_scores[stride * i + col] = score
    outputs[0][...] = out_boxes.reshape(outputs[0].shape)
    outputs[1][...] = out_classes.reshape(outputs[1].shape)
    outputs[2][...] = out_scores.reshape(outputs[2].shape)
    outputs[3][...] = f32(len(rows))


KERNELS = {"TFLite_Detection_PostProcess": detection_postprocess}
