"""The library's signature manifest (jit_kernels/signatures.txt), its text form
of Numba types, and the warm-up that compiles it ahead of a model."""
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
from numba import types

from jit_kernels import manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Kernels that no workload of compile_workloads.py calls, so the recorder gives
# them no manifest entry (they compile at a model's first use).  A new kernel
# must be recorded or named here.
NOT_RECORDED = {
    # the twin (parallel or serial) that the workloads' sizes do not reach
    "columns._col2im",
    "depthwise._depthwise_backward_input", "depthwise._depthwise_backward_kernel",
    "depthwise._depthwise_forward", "pool._avg_pool", "pool._avg_pool_backward",
    "pool._max_pool", "pool._max_pool_backward", "resize._interpolate_axis",
    "resize._interpolate_axis_backward", "sparse._scatter_products",
    # paths no workload takes: float64 products on compiled parts, sampled sparse products
    "packed._product_part_float64", "sparse._paired_dots", "sparse._paired_dots_serial",
    # inline='always' helpers whose callers inline them (no code of their own compiled);
    # _winograd_scratch_size is called from Python only on Winograd's chunk-by-chunk
    # path (a finisher of Python's over many bands), which no workload takes
    "parts.now_ns", "parts.array_at", "parts._epilogue_on", "packed.matmul_packed_panels",
    "winograd._pooled_row",
    "winograd._winograd_scratch_size",
    # what only an export's plan calls (numbackend.export, whose compile links them in)
    "conv.winograd_or_direct", "pool.max_pool_2x2", "winograd._parts_here",
    "winograd.winograd_serial", "copying.gather_rows", "ctc_decode.greedy_decode_packed",
}


@pytest.mark.parametrize("numba_type", [
    types.float32, types.float64, types.int64, types.uint8, types.boolean, types.none,
    types.complex128, types.voidptr,
    types.Array(types.float32, 2, "C"),
    types.Array(types.float64, 1, "A", readonly=True),
    types.Array(types.int32, 3, "F", aligned=False),
    types.UniTuple(types.int64, 3),
    types.Tuple((types.int64, types.float32, types.Array(types.float32, 1, "C"))),
    types.UniTuple(types.UniTuple(types.intp, 2), 2),
    types.Omitted(None), types.Omitted(1.5), types.Omitted("same"),
    types.literal(False), types.literal(3), types.literal("valid"),
    types.CPointer(types.int64), types.NumberClass(types.float32), types.DType(types.float64),
])
def test_a_type_reads_back_as_written(numba_type):
    text = manifest.type_text(numba_type)
    assert manifest.parse_type(text) == numba_type
    assert manifest.type_text(manifest.parse_type(text)) == text


def test_a_signature_reads_back_as_written():
    signature = (types.Array(types.float32, 2, "C"), types.int64, types.literal(False))
    text = manifest.signature_text(signature)
    assert text == "(array(float32, 2, 'C'), int64, Literal(False))"
    assert manifest.parse_signature(text) == signature
    assert manifest.parse_signature("()") == ()
    assert manifest.signature_text((types.int64,)) == "(int64)"
    assert manifest.parse_signature("(int64)") == (types.int64,)
    assert manifest.parse_signature("(int64,)") == (types.int64,)


@pytest.mark.parametrize("text", [
    "int64", "(int64",
    "__import__('os').system('true')", "os", "array(float32, 2, 'Q')", "array(float32)",
    "UniTuple(int64, 'x')", "float32.__class__", "[int64]", "Literal(object)",
])
def test_text_outside_the_grammar_is_refused(text):
    with pytest.raises(ValueError, match="parse_"):
        manifest.parse_signature(text if text.startswith("(") or text == "int64" else f"({text})")


def test_a_type_without_text_is_refused_by_name():
    with pytest.raises(TypeError, match="ListType"):
        manifest.type_text(types.ListType(types.int64))


def test_the_manifest_reads_back_as_written(tmp_path):
    entries = manifest.read_manifest()
    assert entries, "jit_kernels/signatures.txt is empty"
    for name, signature in entries:
        if signature != manifest.PART_SIGNATURE:
            assert manifest.signature_text(manifest.parse_signature(signature)) == signature, name
    path = tmp_path / "signatures.txt"
    manifest.write_manifest(entries, path)
    assert manifest.read_manifest(path) == sorted(set(entries))


def test_every_manifest_kernel_exists_and_takes_its_arguments():
    kernels = manifest.kernels()
    for name, signature in manifest.read_manifest():
        assert name in kernels, f"the manifest names {name}, which jit_kernels does not define"
        kernel = kernels[name]
        if signature == manifest.PART_SIGNATURE:
            assert hasattr(kernel, "part_function"), name
            continue
        parameters = inspect.signature(kernel.py_func).parameters.values()
        required = sum(p.default is inspect.Parameter.empty for p in parameters)
        count = len(manifest.parse_signature(signature))
        assert required <= count <= len(parameters), (name, signature)


def test_every_kernel_is_in_the_manifest():
    recorded = {name for name, _ in manifest.read_manifest()}
    missing = set(manifest.kernels()) - recorded - NOT_RECORDED
    assert not missing, (f"kernels without a manifest entry: {sorted(missing)}; run python -m "
                         f"numbackend compile-report --record (or list them in NOT_RECORDED)")
    assert not NOT_RECORDED & recorded, "NOT_RECORDED names recorded kernels"


def test_kernels_finds_twins_and_compiled_parts():
    from jit_kernels import packed, pool
    kernels = manifest.kernels()
    from jit_kernels import parts
    assert kernels["pool._max_pool"] is pool._max_pool
    assert kernels["pool._max_pool_serial"] is pool._max_pool.serial
    assert kernels["packed._product_part_float32"] is packed.product_parts[4]
    assert "vmath.vectorisable" not in kernels  # plain numba.njit: not cached, nothing to warm
    assert kernels["parts.address"] is parts.address


# Builds a max pooling function, calls it at batch 1 and 2, and prints how many
# jit_kernels kernels compiled and which pooling signatures it used.
_POOLING = textwrap.dedent("""
    import json
    import numpy as np
    from numba.core import event
    import numbackend as K
    from jit_kernels import manifest, pool

    compiled = []
    class Count(event.Listener):
        def on_start(self, event):
            pass
        def on_end(self, event):
            if event.data["dispatcher"].py_func.__module__.startswith("jit_kernels."):
                compiled.append(event.data["dispatcher"].py_func.__qualname__)

    x = K.placeholder((None, 12, 12, 16))
    f = K.function([x], [K.pool2d(x, (2, 2), strides=(2, 2), pool_mode="max")])
    data = np.random.default_rng(0).standard_normal((2, 12, 12, 16)).astype(np.float32)
    with event.install_listener("numba:compile", Count()):
        for batch in (1, 2):
            got = f([data[:batch]])[0]
            want = data[:batch].reshape(batch, 6, 2, 6, 2, 16).max(axis=(2, 4))
            assert np.array_equal(got, want)
    used = [manifest.compiled_signatures(k) for k in (pool._max_pool, pool._max_pool.serial)]
    print(json.dumps({"compiled": compiled, "used": sum(used, [])}))
""")

_POOLING_KERNELS = {"pool._window", "pool._max_pool", "pool._max_pool_serial"}


def _run_pooling(environment):
    done = subprocess.run([sys.executable, "-c", _POOLING], env=environment, check=True,
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _environment(tmp_path, name):
    environment = dict(os.environ, PYTHONPATH=ROOT, NUMBACKEND_PACKAGE_SEED="0",
                       NUMBACKEND_CACHE_DIR=str(tmp_path / name / "kernels"))
    return environment


def test_after_a_warm_up_a_model_compiles_no_library_kernel(tmp_path, monkeypatch):
    entries = [(name, signature) for name, signature in manifest.read_manifest()
               if name in _POOLING_KERNELS and "float64" not in signature]
    assert entries, "the manifest holds no float32 max pooling signatures"
    environment = _environment(tmp_path, "cache")
    monkeypatch.setattr(manifest, "cache_environment", lambda: environment)
    assert not (tmp_path / "cache").exists()
    rows = manifest.warmup(jobs=1, entries=entries, print_progress=None, into=None)
    assert not any(row["error"] for row in rows)
    assert not all(row["loaded"] for row in rows if row["entry"]), "the warm-up compiled nothing"

    # The caches were empty before the warm-up: a pooling signature used and not
    # compiled was loaded from what the warm-up saved.
    pooling = _run_pooling(environment)
    assert pooling["used"], "the pooling used no pooling kernel"
    assert pooling["compiled"] == []

    again = manifest.warmup(jobs=2, entries=entries, print_progress=None, into=None)
    assert sorted((row["kernel"], row["signature"], row["loaded"]) for row in again
                  if row["entry"]) == sorted((name, signature, True) for name, signature in entries)


def test_the_compile_report_lists_slowest_first_and_flags_those_over_budget():
    from numbackend import compile_report
    rows = [{"kernel": "pool._window", "signature": "(int64)", "entry": True, "loaded": False,
             "error": None, "self_s": 0.5, "inclusive_s": 0.5},
            {"kernel": "packed._tile", "signature": "(int64)", "entry": False, "loaded": False,
             "error": None, "self_s": 2.5, "inclusive_s": 2.5},
            {"kernel": "packed.matmul", "signature": "(int64)", "entry": True, "loaded": False,
             "error": None, "self_s": 1.0, "inclusive_s": 3.5}]
    lines = compile_report.format_report(rows, budget_s=2.0).splitlines()
    assert [line.split()[-2] for line in lines[1:4]] == ["packed._tile", "packed.matmul",
                                                         "pool._window"]
    assert "OVER in packed._tile" in lines[1]
    assert "OVER" not in lines[2] + lines[3]
    assert lines[-1].startswith("2 manifest signatures, 1 nested compiles; self time in all 4.0 s; "
                                "1 over the budget of 2 s")
