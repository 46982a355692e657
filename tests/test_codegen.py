"""The generated kernel module's entry points, called directly: results against
NumPy, and shapes unlike the compiled pattern refused by each of them."""
import numpy as np
import pytest

from numbackend import codegen
from numbackend.partition import KernelSpec

# tanh(x0[:, 4:8] + x1) * x2 over a (rows, 4) domain: a window of a wider
# array ('W'), a per-column vector ('C') and a full array ('F')
SPEC = KernelSpec(
    rank=2, split=1, k=0, flat=False,
    inputs=[("W", 2, "float32"), ("C", 1, "float32"), ("F", 2, "float32")],
    nodes=[("add", {}, [("in", 0), ("in", 1)], "float32", "float32"),
           ("tanh", {}, [("node", 0)], "float32", "float32"),
           ("multiply", {}, [("node", 1), ("in", 2)], "float32", "float32")],
    outputs=[(2, "full", False)],
    windows={0: (4, 4)})


@pytest.fixture(scope="module")
def module():
    return codegen.load_kernel(codegen.generate_source(SPEC))


def _inputs(rows, width=12, columns=4, full_rows=None):
    rng = np.random.default_rng(rows)
    return (rng.standard_normal((rows, width)).astype(np.float32),
            rng.standard_normal(columns).astype(np.float32),
            rng.standard_normal((rows if full_rows is None else full_rows, 4)).astype(np.float32))


@pytest.mark.parametrize("entry", ["run", "run_serial"])
@pytest.mark.parametrize("rows", [1, 5])
def test_entry_points_match_numpy(module, entry, rows):
    x0, x1, x2 = _inputs(rows)
    (out,) = getattr(module, entry)(x0, x1, x2)
    np.testing.assert_allclose(out, np.tanh(x0[:, 4:8] + x1) * x2, rtol=1e-6, atol=1e-6)


def test_window_taken_in_place_of_any_layout(module):
    # the window's array is passed as it is (no reshape): a strided one reads right too
    x0, x1, x2 = _inputs(3, width=24)
    strided = x0[:, ::2]
    (out,) = module.run_serial(strided, x1, x2)
    np.testing.assert_allclose(out, np.tanh(strided[:, 4:8] + x1) * x2, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("entry", ["run", "run_serial"])
@pytest.mark.parametrize("case", ["window too narrow", "rows differ", "columns differ"])
def test_shapes_unlike_the_pattern_are_refused(module, entry, case):
    x0, x1, x2 = {"window too narrow": lambda: _inputs(3, width=7),
                  "rows differ": lambda: _inputs(3, full_rows=2),
                  "columns differ": lambda: _inputs(3, columns=5)}[case]()
    with pytest.raises(ValueError, match="do not match the compiled broadcast pattern"):
        getattr(module, entry)(x0, x1, x2)


def test_checks_raise_at_one_place():
    # each raise is code of its own in the compiled run_serial: many made its compile slow
    source = codegen.generate_source(SPEC)
    run_serial = source.split("def run_serial", 1)[1].split("\n\n\n", 1)[0]
    assert run_serial.count("raise ValueError") == 1



def _decorator_of(source, function):
    return source.split(f"\ndef {function}(", 1)[0].rsplit("\n", 1)[1]


def test_only_the_entries_for_compiled_callers_have_an_unoptimised_python_entry():
    # run_serial serves scan loops and whole calls through its address: its
    # wrapper for Python is compiled unoptimised (tests/test_generated_calls.py
    # checks what that compiles to); kernel_ser is called from Python's run at
    # every small call, through an optimised one
    source = codegen.generate_source(SPEC)
    assert "optimised_entry=False" in _decorator_of(source, "run_serial")
    assert "optimised_entry" not in _decorator_of(source, "kernel_ser")
    assert "optimised_entry" not in _decorator_of(source, "kernel_par")


@pytest.fixture(scope="module")
def block_module():
    """The module of SPEC as a scan body's kernel: with ``step_block``."""
    return codegen.load_kernel(codegen.kernel_source(SPEC, in_scan_body=True))


def _run_block(module, arrays, out):
    """``module.step_block`` on ``arrays`` into ``out``, as a scan's loop calls it."""
    from jit_kernels import steps
    row = []
    for (column, rank), a in zip(codegen.step_block_slots(SPEC), list(arrays) + [out]):
        assert len(row) == column
        row += [a.__array_interface__["data"][0], *a.shape]
    steps.run_steps(0, 1, 1, False, np.array([steps.block_address(module.step_block)], np.int64),
                    np.array([row], np.int64), np.zeros((0, 5), np.int64))


@pytest.mark.parametrize("rows", [1, 5])
def test_a_step_block_computes_its_kernel_into_its_output(block_module, rows):
    x0, x1, x2 = _inputs(rows)
    assert codegen.domain_shape(SPEC, [x0.shape, x1.shape, x2.shape]) == (rows, 4)
    out = np.full((rows, 4), np.nan, np.float32)
    _run_block(block_module, (x0, x1, x2), out)
    np.testing.assert_allclose(out, np.tanh(x0[:, 4:8] + x1) * x2, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["window too narrow", "rows differ", "columns differ", "output"])
def test_a_step_block_refuses_shapes_unlike_the_pattern(block_module, case):
    x0, x1, x2 = {"window too narrow": lambda: _inputs(3, width=7),
                  "rows differ": lambda: _inputs(3, full_rows=2),
                  "columns differ": lambda: _inputs(3, columns=5),
                  "output": lambda: _inputs(3)}[case]()
    out = np.zeros((2 if case == "output" else 3, 4), np.float32)
    with pytest.raises(ValueError, match="do not match the compiled broadcast pattern"):
        _run_block(block_module, (x0, x1, x2), out)


def test_a_scan_bodys_kernel_calls_its_serial_loop_by_address():
    # compiled into the block, the serial loop was optimised again with it
    source = codegen.kernel_source(SPEC, in_scan_body=True)
    block = source.split("def step_block(d):", 1)[1].split("\n\n\n", 1)[0]
    assert "SERIAL_LOOP(" in block and "kernel_ser(" not in block
    assert block.count("raise ValueError") == 1
    assert "def step_block" not in codegen.kernel_source(SPEC)
