"""`check --dataset DIR --labels FILE`: top-1 and top-5 accuracy of the oracle and of every
backend on a small labelled set built here, real-valued samples quantized as TFLite's QUANTIZE
does (`--quantize-inputs`), and float outputs' RMSE and cosine similarity beside max |diff|."""

from __future__ import annotations

import json

import numpy as np

from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lab.samples import convert


def classifier(dtype: str = "int8") -> bytes:
    b = ModelBuilder(dtype, seed=8)
    if dtype == "int8":
        x = b.input("x", (1, 12), "int8", 0.04, -3)
    else:
        x = b.input("x", (1, 12), "float32")
    b.output(b.softmax(b.fully_connected(b.fully_connected(x, 16, "RELU"), 7)))
    return b.build()


def labelled_set(tmp_path, model: bytes, count: int = 24):
    """Real-valued samples in a folder, and labels: the oracle's class for most, another for
    every fifth, so that the accuracy is neither 0 nor all."""
    rng = np.random.default_rng(4)
    samples = rng.standard_normal((count, 1, 12)).astype(np.float32)
    folder = tmp_path / "data"
    folder.mkdir()
    for k, sample in enumerate(samples):
        np.save(folder / f"{k:03d}.npy", sample)
    graph = parse_model(model, "m").main
    x = graph.tensors[graph.inputs[0]]
    oracle = LiteRTOracle(model)
    scores = [oracle.invoke([convert(s, x, "s", quantize=True)])[0].ravel() for s in samples]
    predicted = [int(np.argmax(s)) for s in scores]
    labels = [(p + 1) % 7 if k % 5 == 0 else p for k, p in enumerate(predicted)]
    (tmp_path / "labels.txt").write_text("\n".join(map(str, labels)) + "\n")
    top5 = sum(y in np.argsort(-s.astype(np.float64), kind="stable")[:5].tolist()
               for s, y in zip(scores, labels, strict=True))
    return folder, tmp_path / "labels.txt", sum(p == y for p, y in zip(predicted, labels,
                                                                        strict=True)), top5


def test_accuracy_on_labelled_data_per_engine(tmp_path, capsys):
    model = classifier()
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    folder, labels, top1, top5 = labelled_set(tmp_path, model)
    assert 0 < top1 < 24
    code = main(["check", str(path), "--dataset", str(folder), "--labels", str(labels),
                 "--quantize-inputs", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"]
    rows = {a["engine"]: a for a in report["accuracy"]}
    assert list(rows) == ["litert-ref", "runtime_py", "c"]
    assert all(a["top1"] == top1 and a["topk"] == top5 and a["k"] == 5 and a["samples"] == 24
               and a["differs_from_oracle"] == [] for a in rows.values())
    assert main(["check", str(path), "--dataset", str(folder), "--labels", str(labels),
                 "--quantize-inputs"]) == 0
    assert f"labels runtime_py: top-1 {top1}/24, top-5 {top5}/24" in capsys.readouterr().out


def test_quantize_inputs_is_tflites_quantize():
    x = parse_model(classifier(), "m").main.tensors[0]
    values = np.array([[-1.0, -0.02, 0.02, 0.06, 5.0, 0.1, -0.1, 0.0, 0.5, -0.5, 0.3, 1e9]],
                      np.float32)
    got = convert(values, x, "v", quantize=True)
    expected = np.clip(np.sign(values / np.float32(0.04)) * np.floor(
        np.abs(values / np.float32(0.04)) + 0.5) - 3, -128, 127).astype(np.int8)
    assert got.dtype == np.int8 and np.array_equal(got, expected)


def test_float_outputs_get_rmse_and_cosine(tmp_path, capsys):
    path = tmp_path / "m.tflite"
    path.write_bytes(classifier("float32"))
    assert main(["check", str(path), "--inputs", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["outputs"]
    assert all(r["rmse"] is not None and r["rmse"] < 1e-6 and r["cosine"] > 0.999999
               for r in rows)


def test_bad_labels_are_one_line(tmp_path, capsys):
    model = classifier()
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    folder, labels, _, _ = labelled_set(tmp_path, model)
    labels.write_text("1 2 3\n")
    assert main(["check", str(path), "--dataset", str(folder), "--labels", str(labels),
                 "--quantize-inputs"]) == 2
    assert capsys.readouterr().err.strip().endswith("3 labels for 24 samples")
    assert main(["check", str(path), "--labels", str(labels)]) == 2
    assert "--input or --dataset" in capsys.readouterr().err
