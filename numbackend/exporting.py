"""``numbackend.export``: a model's inference plan as a folder that runs with NumPy alone.

The folder is a Python package: ``import DEST; DEST.predict(x)`` needs NumPy
and nothing else (no Numba, llvmlite or Keras), and a C program can call the
same library through ``model.h``.  It holds

- ``model.so``: the whole inference plan compiled into one shared library:
  the plan written as one Numba function (the whole call's lines,
  compiled_plan.render_export) of int64 arguments (the rows of a chunk, the
  address of a table of array addresses), compiled with every kernel it calls
  into one LLVM module (those it calls through their addresses linked in
  too), that module emitted as an object file for the chosen
  CPU target, and linked by the system's C compiler with
  ``export_files/shim.c`` (Numba's allocation, the BLAS names, the weights
  file, chunks and threads, error codes);
- ``weights.bin``: a header, then every array the plan reads besides its
  inputs (weights, packed panels, constants), 64-byte aligned;
- ``__init__.py``: the loader (export_files/loader.py: ctypes and NumPy);
- ``model.h``: the C API;
- ``manifest.json``: the inputs' and outputs' shapes and types (and the
  padding the loader trims from an output whose size depends on the data),
  the CPU target and the features it needs (checked at load), the numbackend
  version, threads.

The folder is built beside DEST under another name, checked (its predictions
of a random batch against the function's, in a process of its own) and only
then renamed into place.  A C compiler (``cc``, or ``$CC``) is needed at
export time only.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import numpy as np

from . import codegen, compiled_plan, core, runtime, tuning
from .graph import format_shape, toposort
from .lowering import lowering_of
from .ops import batch
from .plan import BODIES

FORMAT = 1
# the plan's symbol in the library (shim.c calls it)
PLAN_SYMBOL = "numbackend_export_plan"
_FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "export_files")
# the symbols the plan may leave undefined: shim.c's, libc's and libm's
_PROVIDED = {
    "NRT_MemInfo_alloc_aligned", "NRT_MemInfo_alloc_safe_aligned", "NRT_MemInfo_alloc",
    "NRT_MemInfo_alloc_safe", "NRT_MemInfo_call_dtor", "NRT_Allocate", "NRT_Free",
    "numba_attempt_nocopy_reshape", "numbackend_sgemm", "numbackend_dgemm", "numbackend_sgemv",
    "numbackend_dgemv", "memset", "memcpy", "memmove", "memcmp", "malloc", "free",
}
_LIBM = {"exp", "expf", "log", "logf", "log1p", "log1pf", "expm1", "expm1f", "pow", "powf", "sqrt",
         "sqrtf", "tanh", "tanhf", "sin", "sinf", "cos", "cosf", "tan", "tanf", "atan", "atanf",
         "atan2", "atan2f", "fmod", "fmodf", "floor", "floorf", "ceil", "ceilf", "round", "roundf",
         "erf", "erff", "erfc", "erfcf", "asin", "asinf", "acos", "acosf", "sinh", "sinhf", "cosh",
         "coshf", "asinh", "asinhf", "acosh", "acoshf", "atanh", "atanhf", "exp2", "exp2f",
         "log2", "log2f", "log10", "log10f", "hypot", "hypotf", "cbrt", "cbrtf", "lgamma",
         "lgammaf", "tgamma", "tgammaf", "nextafter", "nextafterf", "trunc", "truncf", "rint",
         "rintf", "fabs", "fabsf", "ldexp", "ldexpf", "frexp", "frexpf", "modf", "modff"}

# Targets: (LLVM CPU name, the /proc/cpuinfo flags code for it may use).  The
# x86-64 levels of the psABI; LZCNT shows as "abm" in /proc/cpuinfo.
_V2 = ["cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"]
_V3 = _V2 + ["abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"]
_V4 = _V3 + ["avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"]
TARGETS = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
_ALIASES = {"avx512": "x86-64-v4", "avx2": "x86-64-v3"}
# The default: AVX2 and FMA (Intel since 2013, AMD since 2015, every x86 cloud
# instance type in use), which numbackend's vector kernels are written for.
DEFAULT_TARGET = "x86-64-v3"
# LLVM's name of a host feature -> its /proc/cpuinfo flag, for target="host"
_HOST_FLAGS = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "popcnt": "popcnt",
    "cx16": "cx16", "sahf": "lahf_lm", "avx": "avx", "avx2": "avx2", "fma": "fma", "bmi": "bmi1",
    "bmi2": "bmi2", "lzcnt": "abm", "movbe": "movbe", "f16c": "f16c", "xsave": "xsave",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512cd": "avx512cd", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2",
    "avx512ifma": "avx512ifma", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bitalg": "avx512_bitalg", "avxvnni": "avx_vnni", "fma4": "fma4", "xop": "xop",
    "sse4a": "sse4a", "aes": "aes", "pclmul": "pclmulqdq", "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq", "gfni": "gfni", "sha": "sha_ni", "adx": "adx",
}


class ExportError(ValueError):
    """A model or function that cannot be exported, or an export that failed."""


def export(model_or_function, dest, *, target=DEFAULT_TARGET, threads=True, overwrite=False,
           verify=True):
    """Write the inference plan of ``model_or_function`` (a Keras model, or a
    ``K.function`` of numbackend) into the folder ``dest``, an importable
    package: with NumPy alone, ``import dest; dest.predict(x)`` gives what the
    model predicts, for any batch size (``predict(x, batch_size=None,
    threads=None)``; a list of arrays for several inputs).  A function's
    outputs must all have the batch (axis 0 of its inputs) as their axis 0.
    An output whose size along another axis depends on the whole batch (a
    greedy ``ctc_decode``'s decodings, padded to the longest) is written at
    its bound and cut by the loader to what the function gives; no other
    step may read it.

    ``target``: the CPU the library is built for: ``"x86-64-v3"`` (AVX2, the
    default), ``"x86-64-v2"``, ``"x86-64-v4"`` (or ``"avx512"``), or
    ``"host"`` (this machine's CPU and features); recorded in manifest.json
    and checked when the folder loads.  ``threads``: False builds a serial
    library (no pthreads).  ``overwrite``: replace an existing ``dest``
    (else refused).  ``verify``: predict a random batch of EXPORT_CHUNK_ROWS + 8 rows
    (more than one chunk) with the folder, in a process of its own, and
    refuse it where it differs from the function's own prediction by more
    than VERIFY_TOLERANCE of the output's scale.

    The folder is written beside ``dest`` under another name and renamed into
    place once verified: an export that fails leaves no folder and an
    existing ``dest`` as it was.

    Raises ExportError naming the step (op, name, shape; for a Keras model,
    the layer) that has no compiled form, or that would mix the rows of a
    batch (the library runs a batch in chunks of rows, each on its own: see
    ops/batch.py), where no C compiler is found, and where the folder's
    predictions differ from the function's.  Returns ``dest``."""
    dest = os.fspath(dest)
    if os.path.lexists(dest) and not overwrite:
        raise ExportError(f"export: {dest!r} exists; pass overwrite=True (--overwrite) to "
                          "replace it")
    function = _function_of(model_or_function)
    cpu, features, flags = _target(target)
    # A fused kernel's loops are vectorised as it compiles, for this machine:
    # 512 bits wide on an AVX-512 host (tuning.FUSED_VECTOR_BITS), which a
    # CPU of a narrower target would run in 256-bit halves; the CPU's own
    # width for those.
    vector_bits = {} if "avx512f" in flags else {"FUSED_VECTOR_BITS": None}
    with tuning.override(**vector_bits):
        program, fed, defaults = function.inference_program()
        inputs = _arrays_of(fed, "input")
        # steps that mix rows first, then those with no compiled form, then those
        # not known to keep rows apart
        _check_rows_apart(program, fed, model_or_function, strict=False)
        rendered = compiled_plan.render_export(program, BODIES)
        if rendered.refused is not None:
            raise ExportError(f"export: this step has no compiled form, so the model cannot be "
                              f"exported: {rendered.refused}")
        _check_rows_apart(program, fed, model_or_function)
        _check_padded_values_are_outputs(program, model_or_function)
        outputs = _arrays_of(program.targets, "output")
        codegen.hold(rendered.kernel_modules, rendered)  # the modules the plan names, while it compiles
        held, scalars = compiled_plan.held_arrays(program, rendered)
        for i, value in enumerate(defaults):  # placeholders not fed: constants of the export
            value = np.ascontiguousarray(value)
            if value.ndim == 0:
                raise ExportError(f"export: placeholder p{len(fed) + i} is a scalar with a default; "
                                  "only arrays can be exported")
            held.append(compiled_plan.Held(f"p{len(fed) + i}", value.shape, value.dtype,
                                           constant=value))
        source = _plan_source(program, rendered, inputs, outputs, held, scalars)
        library, name = _compile(source)
    code = _object_code(library, name, cpu, features)
    key = int.from_bytes(hashlib.sha256(code).digest()[:8], "little") & (2 ** 63 - 1)
    parent, base = os.path.split(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f".{base}.", suffix=".part", dir=parent)
    try:
        os.chmod(folder, 0o777 & ~_umask())  # mkdtemp's folder is the owner's alone
        object_path = os.path.join(folder, "plan.o")
        with open(object_path, "wb") as f:
            f.write(code)
        _link(object_path, os.path.join(folder, "model.so"), key, threads)
        os.remove(object_path)
        _write_weights(os.path.join(folder, "weights.bin"), key, inputs, outputs, held)
        for name_, source_name in (("__init__.py", "loader.py"), ("model.h", "model.h")):
            shutil.copyfile(os.path.join(_FILES, source_name), os.path.join(folder, name_))
        manifest = {
            "format": FORMAT,
            "numbackend": _version(),
            "inputs": inputs,
            "outputs": outputs,
            "target": {"name": target, "cpu": cpu, "features": features, "cpuinfo_flags": flags},
            "threads": bool(threads),
            "chunk_rows": tuning.EXPORT_CHUNK_ROWS,
            "library": "model.so",
            "weights": "weights.bin",
            "plan_key": key,
        }
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        if verify:
            _verify(folder, function, program, fed, inputs)
        _move_into_place(folder, dest, overwrite)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return dest


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _move_into_place(folder, dest, overwrite):
    """Rename ``folder`` to ``dest``; an existing ``dest`` (where ``overwrite``)
    is renamed aside first and removed after (a process that loaded its
    library keeps it)."""
    old = None
    if os.path.lexists(dest):
        if not overwrite:
            raise ExportError(f"export: {dest!r} appeared while exporting; pass overwrite=True "
                              "to replace it")
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", suffix=".old",
                               dir=os.path.dirname(folder))
        old_dest = os.path.join(old, "dest")
        os.rename(dest, old_dest)
    try:
        os.rename(folder, dest)
    except OSError:
        if old is not None:
            os.rename(old_dest, dest)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _verify_rows():
    """Rows of the random batch an export predicts to check its folder: more
    than one chunk, the last one partial."""
    return tuning.EXPORT_CHUNK_ROWS + 8


# The largest difference allowed between the folder's predictions and the
# function's, relative to the largest magnitude of the output (the two sum
# products in other orders): by the output's float type; other types exactly.
VERIFY_TOLERANCE = {"float32": 1e-4, "float64": 1e-10}

# Runs in a process of its own: loads the folder argv[1] as a package, predicts
# the inputs saved in argv[2] and saves the outputs in argv[3].
_VERIFY_SCRIPT = """
import importlib.util, os, sys
import numpy as np
folder = sys.argv[1]
spec = importlib.util.spec_from_file_location("numbackend_export_check",
                                              os.path.join(folder, "__init__.py"),
                                              submodule_search_locations=[folder])
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)
data = np.load(sys.argv[2])
outputs = model.predict([data[f"x{i}"] for i in range(len(data.files))])
outputs = outputs if isinstance(outputs, list) else [outputs]
np.savez(sys.argv[3], *outputs)
"""


def _verify(folder, function, program, fed, inputs):
    """ExportError where the export in ``folder`` predicts a random batch of
    EXPORT_CHUNK_ROWS + 8 rows otherwise than ``function`` (see export's ``verify``)."""
    arrays = _sample_inputs(program, fed, inputs, np.random.default_rng(0))
    want = function.inference_run(arrays)
    with tempfile.TemporaryDirectory() as work:
        np.savez(os.path.join(work, "inputs.npz"), **{f"x{i}": a for i, a in enumerate(arrays)})
        # -B: the check leaves no bytecode in the folder
        done = subprocess.run([sys.executable, "-B", "-c", _VERIFY_SCRIPT, folder,
                               os.path.join(work, "inputs.npz"), os.path.join(work, "out.npz")],
                              check=False, capture_output=True, text=True, cwd=work, timeout=600)
        if done.returncode != 0:
            raise ExportError(f"export: the exported folder failed to predict a random batch of "
                              f"{_verify_rows()} rows:\n{done.stderr[-2000:]}")
        with np.load(os.path.join(work, "out.npz")) as saved:
            got = [saved[f"arr_{j}"] for j in range(len(saved.files))]
    for j, (g, w) in enumerate(zip(got, want)):
        problem = _difference(g, np.asarray(w))
        if problem is not None:
            raise ExportError(f"export: on a random batch of {_verify_rows()} rows, output {j} of "
                              f"the exported library differs from the function's: {problem}; "
                              "the export is refused")


def _difference(got, want):
    """Why ``got`` (the folder's output) is not ``want`` (the function's), or None."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.shape} {got.dtype} against {want.shape} {want.dtype}"
    tolerance = VERIFY_TOLERANCE.get(want.dtype.name)
    if tolerance is None:
        wrong = got != want
        return f"{int(wrong.sum())} entries differ" if wrong.any() else None
    finite = np.isfinite(want)
    if not np.array_equal(np.isnan(got), np.isnan(want)) or not np.array_equal(
            got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]):
        return "NaN or infinite entries differ"
    if not finite.any():
        return None
    scale = float(np.abs(want[finite]).max())
    error = float(np.abs(got[finite].astype(np.float64) - want[finite]).max())
    if error > tolerance * scale:
        return (f"the largest difference is {error:.3g}, over {tolerance:g} of the output's "
                f"largest magnitude {scale:.3g}")
    return None


def _sample_inputs(program, fed, inputs, rng):
    """A random batch of EXPORT_CHUNK_ROWS + 8 rows for the inputs: whole
    numbers an op can take for an input that counts (through a cast or not):
    ids within the table for one that selects rows of one (an Embedding's),
    lengths within the time steps for a CTC decoder's; else floats from a
    normal distribution, integers 0 or 1, booleans."""
    bound = {}  # {placeholder id: the smallest bound (exclusive) on the counts it holds}
    for node in toposort(program.targets):
        found = lowering_of(node).counts_input(node)
        if found is None:
            continue
        counts, limit = node.inputs[found[0]], found[1]
        while counts.op == "cast":
            counts = counts.inputs[0]
        bound[counts.id] = min(bound.get(counts.id, limit), limit)
    arrays = []
    for t, entry in zip(fed, inputs):
        shape = (_verify_rows(), *entry["shape"][1:])
        dtype = np.dtype(entry["dtype"])
        if t.id in bound:
            array = rng.integers(0, bound[t.id], shape)
        elif dtype.kind == "f":
            array = rng.standard_normal(shape)
        elif dtype.kind == "b":
            array = rng.random(shape) < 0.5
        else:
            array = rng.integers(0, 2, shape)
        arrays.append(np.ascontiguousarray(array, dtype))
    return arrays


def _function_of(model_or_function):
    """The runtime.Function to export: the function itself, or a Keras model's
    outputs as a function of its inputs."""
    if isinstance(model_or_function, runtime.Function):
        return model_or_function
    inputs = getattr(model_or_function, "inputs", None)
    outputs = getattr(model_or_function, "outputs", None)
    if isinstance(inputs, list) and isinstance(outputs, list):
        return core.function(inputs, outputs)
    raise TypeError("export: export a Keras model or a K.function, got "
                    f"{type(model_or_function).__name__}")


def _check_rows_apart(program, fed, model, strict=True):
    """ExportError unless each row of every output depends on the same row of
    the inputs alone: the library runs each chunk of EXPORT_CHUNK_ROWS rows of a batch
    on its own (ops/batch.py: each input's axis 0 is the batch, each op's rule
    says where its result's batch axis lies, an op with no rule is refused).
    The error names the op, its tensor and, for a Keras model, the layer.
    Not ``strict``: only the steps known to mix rows, and not the outputs."""
    fed_ids = {t.id for t in fed}
    known = {p.id: batch.Batch(0) if p.id in fed_ids else None for p in program.placeholders}
    try:
        batches = batch.trace(program.targets, known, strict)
    except batch.RowsRefused as exc:
        raise ExportError(f"export: {_in_layer(model, exc.node)}{exc}: an export runs each chunk "
                          f"of {tuning.EXPORT_CHUNK_ROWS} rows of a batch on its own, so each row of its "
                          "outputs must depend on the same row of its inputs alone") from None
    if not strict:
        return
    for i, t in enumerate(program.targets):
        if batches[t.id] != batch.Batch(0):
            where = "no axis" if batches[t.id] is None else batches[t.id]
            raise ExportError(f"export: output {i} ({batch.describe(t)}"
                              f"{_in_layer(model, t, ', ')}) carries the batch on {where}: an "
                              "export needs outputs whose axis 0 is the batch, one entry per row")


def _in_layer(model, node, prefix=""):
    """'layer NAME: ' where ``node`` (by its name) is computed by the Keras layer
    NAME of ``model``, else ''."""
    for layer in getattr(model, "layers", None) or []:
        for inbound in getattr(layer, "_inbound_nodes", []):
            inputs = {t.name for t in toposort(list(inbound.input_tensors))}
            if any(t.name == node.name and t.name not in inputs
                   for t in toposort(list(inbound.output_tensors))):
                return f"{prefix}layer {layer.name!r}" + ("" if prefix else ": ")
    return ""


def _arrays_of(tensors, kind):
    """The manifest's entries of the inputs or outputs: each one's name, shape
    (axis 0 the batch, None) and dtype, and for an output with an axis whose
    size depends on the data (Lowering.export_padding), its size as the
    library writes it and "trim": {"axis", "pad"}, which the loader drops
    (see export_files/model.h); ExportError where axis 0 is not the batch or
    another axis has no size."""
    entries = []
    for i, t in enumerate(tensors):
        padding = lowering_of(t).export_padding(t) if kind == "output" else None
        shape = list(t.shape)
        if padding is not None:
            shape[padding.axis] = padding.size
        if t.ndim == 0 or shape[0] is not None or None in shape[1:]:
            raise ExportError(f"export: {kind} {i} ({t.name!r}) has shape {format_shape(t.shape)}: "
                              "an export needs axis 0 of unknown size (the batch) and every "
                              "other axis known")
        entry = {"name": str(t.name), "shape": [None] + [int(d) for d in shape[1:]],
                 "dtype": np.dtype(t.dtype).name}
        if padding is not None:
            entry["trim"] = {"axis": padding.axis, "pad": padding.value}
        entries.append(entry)
    return entries


def _check_padded_values_are_outputs(program, model):
    """ExportError where a value whose export writes an axis padded to its
    bound (Lowering.export_padding: CTC's decodings) is read by another step,
    which would see the padding: only the loader trims it, at the outputs."""
    for node in toposort(program.targets):
        for value in node.inputs:
            padding = lowering_of(value).export_padding(value)
            if padding is not None:
                raise ExportError(
                    f"export: {batch.describe(value)}{_in_layer(model, value, ', ')} is read by "
                    f"{batch.describe(node)}: an export writes its axis {padding.axis}, whose size "
                    f"depends on the data, at {padding.size} entries padded with "
                    f"{padding.value!r}, and trims them only where it is an output of the "
                    "function; export it as an output and compute the rest with NumPy")


def _target(target):
    """(LLVM CPU name, LLVM features, /proc/cpuinfo flags the code needs) of
    ``target``; ExportError where this machine cannot run it."""
    import llvmlite.binding as llvm
    name = _ALIASES.get(target, target)
    if name == "host":
        features = llvm.get_host_cpu_features()
        enabled = sorted(f for f, on in features.items() if on)
        flags = sorted({_HOST_FLAGS[f] for f in enabled if f in _HOST_FLAGS})
        return llvm.get_host_cpu_name(), features.flatten(), flags
    if name not in TARGETS:
        raise ExportError(f"export: target must be one of {sorted(TARGETS) + ['host', 'avx512']}, "
                          f"got {target!r}")
    if not llvm.get_process_triple().startswith("x86_64"):
        raise ExportError(f"export: target {target!r} is an x86-64 level; this machine is "
                          f"{llvm.get_process_triple()}: use target='host'")
    flags = TARGETS[name]
    here = cpu_flags()
    missing = sorted(set(flags) - here) if here is not None else []
    if missing:
        raise ExportError(f"export: this machine's CPU lacks {', '.join(missing)} of target "
                          f"{target!r}, so the export could not be checked here: choose an "
                          "older target or target='host'")
    return name, "", flags


def cpu_flags(path="/proc/cpuinfo"):
    """The flags of the first CPU in ``path`` (a set), or None where it cannot be read.
    export_files/loader.py has the same function: an export runs without numbackend."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def _plan_source(program, rendered, inputs, outputs, held, scalars):
    """The Numba module of the plan: ``plan(rows, table)``, the table holding
    the addresses of the inputs, the outputs and the held arrays, in order."""
    count = len(inputs) + len(outputs) + len(held)
    lines = compiled_plan.HEADER + rendered.import_lines + rendered.kernel_lines
    lines += ["import numba", "", "",
              "@numba.njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)",
              "def plan(rows, table):",
              f"    t = parts.array_at(table, ({count},), np.int64)"]
    for i, entry in enumerate(inputs):
        shape = "".join(f", {d}" for d in entry["shape"][1:])
        lines.append(f"    p{i} = parts.array_at(t[{i}], (rows{shape}), np.{entry['dtype']})")
    for k, h in enumerate(held):
        dtype = "bool_" if h.dtype == np.bool_ else h.dtype.name
        item = "[0]" if h.name in scalars else ""
        shape = tuple(int(d) for d in h.shape)
        lines.append(f"    {h.name} = parts.array_at(t[{len(inputs) + len(outputs) + k}], "
                     f"{shape!r}, np.{dtype}){item}")
    lines += ["    " + line for line in rendered.lines]
    for j, (entry, name) in enumerate(zip(outputs, program.result_names)):
        shape = "".join(f", {d}" for d in entry["shape"][1:])
        lines.append(f"    copying.copy_into(parts.array_at(t[{len(inputs) + j}], (rows{shape}), "
                     f"np.{entry['dtype']}), {name})")
    lines.append("    return 0")
    return "\n".join(lines) + "\n"


def _compile(source):
    """(Numba's code library of the plan, with every callee linked in but those
    called by address, which :func:`_object_code` links; the plan's symbol in
    it)."""
    from numba import types as numba_types
    from numba.core.errors import NumbaError
    name = "numbackend_export_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    module = types.ModuleType(name)
    sys.modules[name] = module  # Numba looks a function's globals up through its module
    try:
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - our own source
        plan = module.plan
        try:
            plan.compile((numba_types.int64, numba_types.int64))
        except NumbaError as exc:
            raise ExportError(f"export: the plan did not compile ({type(exc).__name__}: "
                              f"{str(exc)[:500]})") from exc
        result = plan.overloads[plan.signatures[0]]
        return result.library, result.fndesc.mangled_name
    finally:
        del sys.modules[name]


def _object_code(library, name, cpu, features):
    """The plan's function and all it calls (the kernels called by address
    linked in) as an object file for ``cpu`` and ``features``, its symbol
    PLAN_SYMBOL, nothing else exported.  ExportError
    where it needs a symbol that neither the shim nor libc/libm defines (an
    address of this process: parts on OpenBLAS's pool)."""
    import llvmlite.binding as llvm
    module = llvm.parse_assembly(library.get_llvm_str())
    _link_kernels_by_address(module)
    for function in module.functions:
        if function.is_declaration:
            continue
        if function.name == name:
            function.name = PLAN_SYMBOL
            function.visibility = "hidden"  # the shim's API alone leaves the library
        else:
            function.linkage = "internal"
    for variable in module.global_variables:
        if not variable.is_declaration:
            variable.linkage = "internal"
    machine = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default")
    passes = llvm.create_new_module_pass_manager()
    passes.add_global_dead_code_eliminate_pass()
    passes.add_strip_dead_prototype_pass()
    passes.run(module, llvm.create_pass_builder(
        machine, llvm.create_pipeline_tuning_options(speed_level=0)))
    needed = sorted(f.name for f in module.functions
                    if f.is_declaration and not f.name.startswith("llvm."))
    needed += sorted(v.name for v in module.global_variables if v.is_declaration)
    unknown = [s for s in needed if s not in _PROVIDED and s not in _LIBM]
    if unknown:
        raise ExportError(f"export: the compiled plan needs {', '.join(unknown)}, which an "
                          "export cannot provide (a part run on OpenBLAS's threads, or a call "
                          "into Python)")
    module.verify()
    return machine.emit_object(module)


def _link_kernels_by_address(module):
    """Link into ``module`` (the plan's LLVM module) the code of every kernel
    that its code calls through jit_kernels.compiling.by_address, and of those
    that these call so, until it calls no such symbol: each is bound to an
    address of this process, which a library of its own cannot call.  Each
    kernel's code comes in as Numba links it into a caller, with the kernel's
    function named as the symbol, so that every call of the symbol, in code
    linked already or later, resolves to it."""
    import llvmlite.binding as llvm

    from jit_kernels import compiling
    while True:
        symbols = [f.name for f in module.functions
                   if f.is_declaration and compiling.is_by_address_symbol(f.name)]
        if not symbols:
            return
        for symbol in symbols:
            library, name = compiling.bound_kernel(symbol)
            # a copy: Numba links the same module into the kernel's later callers
            code = llvm.parse_bitcode(library._get_module_for_linking().as_bitcode())
            kernel = code.get_function(name)
            kernel.name = symbol
            if kernel.name != symbol:  # LLVM renamed it: the code declares the symbol itself
                raise ExportError(f"export: the kernel {name} calls itself through its address "
                                  f"({symbol}), which an export cannot link")
            module.link_in(code)


def _compiler():
    """The C compiler: $CC, else cc, gcc or clang on the PATH."""
    for candidate in [os.environ.get("CC"), "cc", "gcc", "clang"]:
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise ExportError("export: no C compiler found (cc, gcc or clang on the PATH, or $CC): an "
                      "export links its library with one (needed at export time only)")


def _link(object_path, library_path, key, threads):
    command = [_compiler(), "-shared", "-fPIC", "-O2", "-fvisibility=hidden",
               f"-DNUMBACKEND_PLAN_KEY={key}ULL",
               "-I", _FILES, os.path.join(_FILES, "shim.c"), object_path, "-o", library_path,
               "-Wl,-z,noexecstack", "-lm"]
    command[5:5] = ["-pthread"] if threads else ["-DNUMBACKEND_SERIAL"]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise ExportError(f"export: linking the library failed ({' '.join(command)}):\n"
                          f"{done.stderr[-2000:]}")


def _write_weights(path, key, inputs, outputs, held):
    """weights.bin (see export_files/shim.c, numbackend_model_open): the header,
    then each held array at a multiple of 64 bytes."""
    def row_bytes(entry):
        return int(np.prod(entry["shape"][1:], dtype=np.int64)) * np.dtype(entry["dtype"]).itemsize

    header = [0, 1, key, len(inputs), len(outputs), len(held), tuning.EXPORT_CHUNK_ROWS]
    header += [row_bytes(e) for e in inputs] + [row_bytes(e) for e in outputs]
    offset = -(-8 * (len(header) + len(held)) // 64) * 64
    offsets, arrays = [], []
    for h in held:
        array = np.ascontiguousarray(h.array())
        offsets.append(offset)
        arrays.append(array)
        offset += -(-max(array.nbytes, 1) // 64) * 64
    numbers = np.array(header + offsets, np.int64)
    with open(path + ".new", "wb") as f:
        f.write(b"NBWEIGHT")
        f.write(numbers[1:].tobytes())
        for start, array in zip(offsets, arrays):
            f.write(b"\0" * (start - f.tell()))
            f.write(array.tobytes())
        f.write(b"\0" * (offset - f.tell()))
    os.replace(path + ".new", path)


def _version():
    from importlib import metadata
    try:
        return metadata.version("numbackend")
    except metadata.PackageNotFoundError:
        return "unknown"
