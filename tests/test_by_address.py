"""jit_kernels.compiling.by_address: a kernel called from compiled code through
its address, not compiled again into its caller; its result and exceptions
as from a direct call; a cached caller loaded, and compiled against, in later
processes."""
import os
import re
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from jit_kernels.compiling import by_address

# Plain Numba dispatchers, compiled afresh in each process: a test reads their
# LLVM code, which code loaded from a cache does not keep


@numba.njit
def scaled_sum(x, k):
    if k < 0:
        raise ValueError("scaled_sum: k must not be negative")
    total = 0.0
    for i in range(x.size):
        total += x[i] * k
    return total


_scaled_sum_by_address = by_address(scaled_sum)


@numba.njit
def sum_by_address_plus_one(x, k):
    return _scaled_sum_by_address(x, k) + 1.0


@numba.njit
def sum_directly_plus_one(x, k):
    return scaled_sum(x, k) + 1.0


def _llvm_code(caller):
    """The LLVM code compiled for ``caller``'s one signature (its callees' linked in)."""
    [argument_types] = caller.signatures
    return caller.overloads[argument_types].library.get_llvm_str()


def test_a_kernel_called_by_address_computes_as_a_direct_call():
    x = np.linspace(-1.0, 2.0, 7)
    assert sum_by_address_plus_one(x, 3) == pytest.approx(3 * x.sum() + 1.0, rel=1e-12)
    assert sum_by_address_plus_one(x, 3) == sum_directly_plus_one(x, 3)


def test_a_kernel_called_by_address_is_not_compiled_into_its_caller():
    x = np.ones(3)
    sum_by_address_plus_one(x, 2)
    sum_directly_plus_one(x, 2)
    # the kernel's error message is a constant of its code: a direct call
    # compiles that code into the caller
    assert "k must not be negative" in _llvm_code(sum_directly_plus_one)
    by_address_code = _llvm_code(sum_by_address_plus_one)
    assert "k must not be negative" not in by_address_code
    assert re.search(r"declare .*@\"?numbackend_by_address\.[\w.]*\.scaled_sum\.", by_address_code)


def test_an_exception_in_a_kernel_called_by_address_reaches_the_caller():
    with pytest.raises(ValueError, match="scaled_sum: k must not be negative"):
        sum_by_address_plus_one(np.ones(3), -1)


CALLERS = textwrap.dedent("""\
    import numpy as np
    from numba import carray

    from jit_kernels import parts
    from jit_kernels.compiling import by_address, njit_cached


    @njit_cached()
    def scaled_sum(x, k):
        total = 0.0
        for i in range(x.size):
            total += x[i] * k
        return total


    _scaled_sum_by_address = by_address(scaled_sum)


    @njit_cached()
    def inner(x, k):
        return _scaled_sum_by_address(x, k) + 1.0


    @njit_cached()
    def outer(x, k):
        return 2.0 * inner(x, k)


    def _inner_part(d):
        # d: the address and length of x, then the address of the result
        row = carray(d, 3)
        result = parts.array_at(row[2], (1,), np.float64)
        result[0] = inner(parts.array_at(row[0], (row[1],), np.float64), 3)


    inner_part = parts.compiled_part(_inner_part)
""")

RUN = textwrap.dedent("""
    import sys
    import numba
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import callers
    x = np.arange(4.0)
    if sys.argv[2] == "inner_part":
        _, part = callers.inner_part()
        # code finalised after the part's load resolves the symbols of every
        # code loaded before it: one the part's entry left unbound failed here
        numba.njit(lambda v: v + 1)(1)
        result = np.zeros(1)
        part(np.array([x.ctypes.data, x.size, result.ctypes.data], np.int64).ctypes.data)
        print(result[0], callers.inner_part.callback.cache_hits)
    else:
        kernel = getattr(callers, sys.argv[2])
        print(kernel(x, 3), sum(kernel.stats.cache_hits.values()))
""")


def _run_in_new_processes(folder):
    """A function running RUN in a new process on the CALLERS module in ``folder``
    with the kernel cache under it: (value, cache hits)."""
    (folder / "callers.py").write_text(CALLERS)
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(folder / "cache"))

    def run(kernel):
        out = subprocess.run([sys.executable, "-c", RUN, str(folder), kernel], env=env,
                             capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        value, hits = out.stdout.split()
        return float(value), int(hits)
    return run


EXPECTED = 3 * np.arange(4.0).sum() + 1.0


def test_a_cached_caller_of_a_kernel_by_address_loads_in_later_processes(tmp_path):
    # outer calls inner directly, so its compiled code holds inner's, and with
    # it the call to scaled_sum's symbol, which must be bound before outer is
    # loaded: also where outer was compiled against an inner loaded from the
    # cache (an unbound symbol crashes the process)
    run = _run_in_new_processes(tmp_path)
    assert run("inner") == (EXPECTED, 0)  # compiled and saved
    assert run("outer") == (2 * EXPECTED, 0)  # compiled against the cached inner
    assert run("outer") == (2 * EXPECTED, 1)  # loaded


def test_a_cached_compiled_part_calling_a_kernel_by_address_loads_in_later_processes(tmp_path):
    # a C callback's code is linked with its callees' only when it is saved
    run = _run_in_new_processes(tmp_path)
    assert run("inner_part") == (EXPECTED, 0)  # compiled and saved
    assert run("inner_part") == (EXPECTED, 1)  # loaded
