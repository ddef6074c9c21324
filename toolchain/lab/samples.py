"""The user's own input data for `check`: files read into input sets of a model.

A sample is one value per model input. It comes as
- a .npy array, for a model with one input;
- a .npz archive holding one array per input, each named by the input's tensor name, its
  index ("0", "1", ...) or numpy's default name for it (`arr_0`, ... from `np.savez(a, b)`);
- a directory of .npy or .csv files named the same way (`0.npy`, `input_1.csv`, ...);
- a CSV file of comma- or whitespace-separated numbers, as TFLite Micro's examples keep test
  data, for a model with one input: the values in row-major order.

An array of the input's shape is one sample; one of shape [N, *shape] (or a CSV holding N
times the input's element count) is N samples in a row. `--dataset DIR` reads every entry of
DIR, in name order, as one such file or directory. Values must be of the input's dtype or
convertible to it exactly: integers within its range, any real number for a float input.
"""

from __future__ import annotations

import os

import numpy as np

from toolchain.errors import ArenacError
from toolchain.files import load_arrays, read_bounded
from toolchain.ir import Graph, Tensor
from toolchain.lab.oracle_process import first_line
from toolchain.numerics.tables import round_half_away_from_zero

SUFFIXES = (".npy", ".npz", ".csv")


def load_samples(graph: Graph, path: str, quantize: bool = False) -> list[list[np.ndarray]]:
    """The input sets one --input FILE holds, in order; with `quantize`, real values for a
    quantized integer input are quantized as TFLite's QUANTIZE does (see convert)."""
    if os.path.isdir(path):
        return stack_inputs(graph, directory_arrays(graph, path, quantize), path)
    if not os.path.exists(path):
        raise ArenacError("no such file or directory", path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".npz":
        return stack_inputs(graph, archive_arrays(graph, path, quantize), path)
    if suffix not in (".npy", ".csv"):
        raise ArenacError("input data must be a .npy, .npz or .csv file or a directory of them",
                          path)
    if len(graph.inputs) != 1:
        raise ArenacError(f"the model takes {len(graph.inputs)} inputs: give them in one .npz "
                          "or a directory, one array per input", path)
    return stack_inputs(graph, [read_array(path, graph.tensors[graph.inputs[0]], quantize)],
                        path)


def load_dataset(graph: Graph, directory: str,
                 quantize: bool = False) -> list[list[np.ndarray]]:
    """Every sample file (or sample directory) in `directory`, in name order."""
    if not os.path.isdir(directory):
        raise ArenacError("not a directory", directory)
    entries = [os.path.join(directory, e) for e in listing(directory) if not e.startswith(".")]
    entries = [e for e in entries if os.path.isdir(e) or e.lower().endswith(SUFFIXES)]
    if not entries:
        raise ArenacError("no .npy, .npz or .csv files or sample directories in it", directory)
    return [values for entry in entries for values in load_samples(graph, entry, quantize)]


def listing(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError as e:
        raise ArenacError(f"cannot list ({e.strerror})", directory) from None


def input_keys(graph: Graph, i: int) -> tuple[str, ...]:
    """The names input i may go by in an archive or a directory."""
    return (graph.tensors[graph.inputs[i]].name, str(i), f"arr_{i}", f"input_{i}")


def archive_arrays(graph: Graph, path: str, quantize: bool = False) -> list[np.ndarray]:
    found = load_arrays(path)
    if not isinstance(found, dict):
        raise ArenacError("an .npy array named .npz: rename it .npy", path)
    arrays = []
    for i, t in enumerate(graph.inputs):
        key = next((k for k in input_keys(graph, i) if k in found), None)
        if key is None:
            raise ArenacError(f"no array for input {i} ({graph.tensors[t].name!r}); it holds "
                              f"{', '.join(sorted(found)) or 'none'}", path)
        arrays.append(convert(found.pop(key), graph.tensors[t], f"{path}[{key}]", quantize))
    if found:
        raise ArenacError(f"arrays {', '.join(sorted(found))} name no input of the model", path)
    return arrays


def directory_arrays(graph: Graph, directory: str, quantize: bool = False) -> list[np.ndarray]:
    files = {os.path.splitext(e)[0]: os.path.join(directory, e)
             for e in listing(directory) if e.lower().endswith((".npy", ".csv"))}
    arrays = []
    for i, t in enumerate(graph.inputs):
        key = next((k for k in input_keys(graph, i) if k in files), None)
        if key is None:
            raise ArenacError(f"no file for input {i} ({graph.tensors[t].name!r}): name it "
                              f"{i}.npy or {i}.csv", directory)
        arrays.append(read_array(files[key], graph.tensors[t], quantize))
    return arrays


def read_array(path: str, tensor: Tensor, quantize: bool = False) -> np.ndarray:
    """A .npy or CSV file as values of `tensor`'s dtype (CSV values reshaped to its shape)."""
    if path.lower().endswith(".csv"):
        return convert(read_csv(path, tensor), tensor, path, quantize)
    value = load_arrays(path)
    if not isinstance(value, np.ndarray):
        raise ArenacError("an .npz archive named .npy: rename it .npz", path)
    return convert(value, tensor, path, quantize)


def read_csv(path: str, tensor: Tensor) -> np.ndarray:
    try:
        text = read_bounded(path).decode()
    except UnicodeDecodeError as e:
        raise ArenacError(f"cannot read ({first_line(e)})", path) from None
    words = text.replace(",", " ").split()
    try:
        numbers = [int(w) for w in words]
    except ValueError:
        try:
            numbers = [float(w) for w in words]
        except ValueError as e:
            raise ArenacError(f"not a CSV of numbers ({first_line(e)})", path) from None
    size = tensor.num_elements
    if not numbers or len(numbers) % max(size, 1):
        raise ArenacError(f"holds {len(numbers)} values; input {tensor.name!r} "
                          f"{tensor.dtype}{list(tensor.shape)} takes {size} per sample", path)
    values = np.array(numbers, np.int64 if all(isinstance(n, int) for n in numbers) else None)
    return values.reshape(-1, *tensor.shape)


def convert(value: np.ndarray, tensor: Tensor, path: str, quantize: bool = False) -> np.ndarray:
    """`value` in `tensor`'s dtype when that changes no value, else one line saying why not.
    With `quantize`, real values for a quantized integer input become its integers as TFLite's
    QUANTIZE computes them (AffineQuantize: round(value / scale) half away from zero in
    float32, plus the zero point, clamped to the type)."""
    dtype = np.dtype(tensor.dtype)
    if value.dtype == dtype:
        return value
    if quantize and dtype.kind in "iu" and value.dtype.kind == "f":
        if tensor.quantization is None or len(tensor.quantization.scale) != 1:
            raise ArenacError(f"--quantize-inputs: input {tensor.name!r} has no per-tensor "
                              "quantization", path)
        scale, zero_point = tensor.quantization.scale[0], tensor.quantization.zero_point[0]
        with np.errstate(all="ignore"):
            scaled = value.astype(np.float32) / np.float32(scale)
        if not np.isfinite(scaled).all():
            raise ArenacError("--quantize-inputs: values that are not finite", path)
        info = np.iinfo(dtype)
        rounded = round_half_away_from_zero(scaled).astype(np.int64)
        return np.clip(rounded + zero_point, info.min, info.max).astype(dtype)
    if dtype.kind == "f" and value.dtype.kind in "fiu":
        return value.astype(dtype)
    if dtype.kind in "iu" and value.dtype.kind in "iu" and value.size:
        info = np.iinfo(dtype)
        if int(value.min()) >= info.min and int(value.max()) <= info.max:
            return value.astype(dtype)
        raise ArenacError(f"values from {int(value.min())} to {int(value.max())} do not fit "
                          f"input {tensor.name!r}, {tensor.dtype}", path)
    if dtype.kind == "b" and value.dtype.kind in "iu" and np.isin(value, (0, 1)).all():
        return value.astype(dtype)
    raise ArenacError(f"holds {value.dtype} values; input {tensor.name!r} is {tensor.dtype}"
                      + (" (quantize them first)" if value.dtype.kind == "f" else ""), path)


def stack_inputs(graph: Graph, arrays: list[np.ndarray], path: str) -> list[list[np.ndarray]]:
    """Input sets from one array per input: each of the input's shape (one set) or of shape
    [N, *shape] (N sets), the same N for every input."""
    arrays = list(arrays)
    for i, (t, value) in enumerate(zip(graph.inputs, arrays, strict=True)):
        tensor = graph.tensors[t]
        shape = tuple(value.shape)
        if shape == tensor.shape:
            arrays[i] = value[np.newaxis]
        elif not (shape[1:] == tensor.shape and shape[0]):
            dims = list(tensor.shape)
            raise ArenacError(
                f"input {i} ({tensor.name!r}) takes {tensor.dtype}{dims} (one sample) or "
                f"[N, {', '.join(map(str, dims))}] (N samples); the data is {list(shape)}", path)
    counts = [len(a) for a in arrays]
    if len(set(counts)) > 1:
        said = ", ".join(map(str, counts))
        raise ArenacError(f"the inputs hold different numbers of samples ({said})", path)
    return [[a[k] for a in arrays] for k in range(counts[0])]
