"""Generated code (a scan's loop, a whole call) calls library kernels and
other generated modules' kernels (a fused kernel's run_serial) through their addresses
(jit_kernels.compiling.by_address): its cache entry names them, a new
process binds them (loading generated modules by name, codegen.load_by_name)
and loads the cached code without compiling anything."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from jit_kernels import blas
from numbackend import codegen
from tests.rnn_scripts import TANH_RNN

_RNN_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import numbackend as K
    from jit_kernels import compiling
    from numbackend import codegen

    def _attributes(result, name):
        function = result.library._final_module.get_function(getattr(result.fndesc, name))
        return b" ".join(function.attributes).decode()
""") + TANH_RNN + textwrap.dedent("""
    last, _, _ = K.rnn(step, x, [h0])
    fn = K.function([x, h0], [last])
    xv, hv = np.linspace(-1, 1, 24).reshape(2, 4, 3), np.ones((2, 3))
    got = fn([xv, hv])[0]
    h = hv
    for t in range(4):
        h = np.tanh(h @ w_value + xv[:, t])
    # the functions of generated modules that compiled code calls, and the
    # kernels that their code calls through addresses (of code compiled in
    # this process: loaded code keeps no LLVM text)
    called = {}
    for module in list(codegen._live.values()):
        for name in ("loop",):
            function = getattr(module, name, None)
            for result in (function.overloads.values() if function is not None else ()):
                if sum(function.stats.cache_misses.values()):
                    called[name] = [[m, q] for m, q, _ in
                                    compiling.by_address_bindings(result.library)]
                    called["entry_attributes"] = _attributes(result, "llvm_cpython_wrapper_name")
                    called["body_attributes"] = _attributes(result, "llvm_func_name")
    print(json.dumps({"compiled": codegen.numba_stats()["compiled"],
                      "close": bool(np.allclose(got, h, rtol=1e-12, atol=0)),
                      "result": got.tolist(), "called": called}))
""")


def _run_rnn(cache):
    # the loop as a generated function (as whole calls and exports run it)
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(cache), NUMBACKEND_TUNE_SCAN_LOOP_FORM="generated")
    out = subprocess.run([sys.executable, "-c", _RNN_SCRIPT], env=env, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_scan_loop_calls_its_kernels_by_address_and_loads_in_a_new_process(tmp_path):
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    first = _run_rnn(tmp_path)
    assert first["close"] and first["compiled"] > 0
    # the loop calls the step's fused kernel and the product (on packed panels
    # or through BLAS) through their addresses: neither is compiled again inside the loop
    loop_calls = {tuple(c) for c in first["called"]["loop"]}
    assert any(m.startswith("numbackend_kernels.k_") and q == "run_serial" for m, q in loop_calls)
    assert ("jit_kernels.packed", "step_product") in loop_calls
    # and slices its sequences and stacks its values through the library: Numba's
    # slicing code at each of them made much of a large loop's compile
    assert {("jit_kernels.copying", "step_rows"), ("jit_kernels.copying", "copy_step")} <= loop_calls
    # its entry from Python (Numba's wrapper unboxing the arguments) is left
    # unoptimised, its body is not
    assert "optnone" in first["called"]["entry_attributes"].split()
    assert "optnone" not in first["called"]["body_attributes"].split()
    # a new process binds them again and loads the loop: nothing compiles, the same bits
    second = _run_rnn(tmp_path)
    assert second["close"] and second["compiled"] == 0
    assert second["result"] == first["result"]


def test_a_generated_module_is_loaded_by_name_from_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))
    source = "VALUE = 41 + 1\n"
    key = codegen._source_key(source)
    with open(os.path.join(codegen.cache_dir(), f"k_{key}.py"), "w") as f:
        f.write(source)
    name = f"numbackend_kernels.k_{key}"
    sys.modules.pop(name, None)
    module = codegen.load_by_name(name)
    assert module.VALUE == 42 and module.__name__ == name


def test_a_generated_module_whose_file_does_not_match_its_name_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))
    key = codegen._source_key("VALUE = 1\n")
    with open(os.path.join(codegen.cache_dir(), f"k_{key}.py"), "w") as f:
        f.write("VALUE = 2\n")
    with pytest.raises(LookupError, match=f"k_{key}"):
        codegen.load_by_name(f"numbackend_kernels.k_{key}")
    with pytest.raises(LookupError, match="not the name of a generated kernel module"):
        codegen.load_by_name("numbackend_kernels.k_../x")


def _add_same_shapes(a, b):
    if a.shape != b.shape:
        raise ValueError("shapes differ")
    return a + b


def test_a_function_with_an_unoptimised_entry_computes_and_raises_as_any_other(tmp_path, monkeypatch):
    # compiled, not loaded: a code library loaded from the cache has no entry to look at
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))
    import numpy as np
    from numba.core.errors import TypingError

    from jit_kernels.compiling import njit_cached
    add = njit_cached(optimised_entry=False)(_add_same_shapes)
    a, b = np.linspace(-1.0, 1.0, 7), np.arange(7.0)
    np.testing.assert_array_equal(add(a, b), np.asarray([x + y for x, y in zip(a, b)]))
    with pytest.raises(ValueError, match="shapes differ"):
        add(a, b[:3])
    with pytest.raises(TypingError):  # as from Numba's own entry
        add(a, "b")
    (result,) = add.overloads.values()
    entry = result.library._final_module.get_function(result.fndesc.llvm_cpython_wrapper_name)
    assert b"optnone" in b" ".join(entry.attributes)
