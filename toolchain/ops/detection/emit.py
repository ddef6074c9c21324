"""C emitter for TFLite_Detection_PostProcess, laid out by templates/c/detection.c.j2: the op's
function and the helpers it calls (intersection over union, the stable sort, the ranking, one
suppression pass), named with the op's prefix, every working array in its one scratch buffer.
Python computes each expression (how an input is read, the constants); the template lays them
out."""

from __future__ import annotations

from toolchain.ops.detection.prepare import (
    Dequantized,
    DetectionParams,
    scratch_layout,
)
from toolchain.ops.emit import MATH_H, Kernel, OpContext, c_comment, c_float, render_macro

TEMPLATE = "c/detection.c.j2"


def read(value: str, q: Dequantized | None) -> str:
    """C for one input value as LiteRT reads it: dequantized in float, or as it is."""
    if q is None:
        return value
    return f"((float){value} - {c_float(q.zero_point)}) * {c_float(q.scale)}"


def c_double(value: float) -> str:
    """A double literal of a float32 value (exact: repr round-trips the double)."""
    text = repr(float(value))
    return text if any(c in text for c in ".e") else f"{text}.0"


def emit_detection_postprocess(ctx: OpContext) -> Kernel:
    p: DetectionParams = ctx.params
    encodings, scores, anchors = ctx.inputs[:3]
    how = "regular (one suppression per class, then the best overall)" if p.regular else \
        f"fast (each box by its best {p.top_classes} of {p.num_classes} classes)"
    comment = (f"TFLite_Detection_PostProcess: the {p.num_boxes} boxes of '{encodings.name}' "
               f"decoded against '{anchors.name}', then {how} non-maximum suppression of the "
               f"scores of '{scores.name}' (kept at or above {p.score_threshold:g}, suppressed "
               f"past {p.iou_threshold:g} overlap), as LiteRT computes them.")
    layout = scratch_layout(p)
    ys, xs, hs, ws = (c_double(s) for s in p.scales)
    return Kernel(render_macro(TEMPLATE, "detection_postprocess", {
        "fn": ctx.fn,
        "prefix": ctx.prefix,
        "comment": c_comment(comment),
        "p": p,
        "encodings": encodings.ptr,
        "encoding_ctype": encodings.ctype,
        "scores_in": scores.ptr,
        "scores_ctype": scores.ctype,
        "anchors": anchors.ptr,
        "anchor_ctype": anchors.ctype,
        "outputs": [t.ptr for t in ctx.outputs],
        "scratch": ctx.scratch[0],
        "parts": layout.parts,
        "box": [read(f"e[{k}]", p.boxes) for k in range(4)],
        "anchor": [read(f"a[{k}]", p.anchors) for k in range(4)],
        "score": read("scores_in[i]", p.scores),
        "scale": {"y": ys, "x": xs, "h": hs, "w": ws},
        "score_threshold": c_float(p.score_threshold),
        "iou_threshold": c_float(p.iou_threshold),
    }), helpers=("detection_failure",), includes=(MATH_H,))
