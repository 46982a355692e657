"""The kernel cache: entries checked against the source they were written from,
and concurrent writers."""
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading
import uuid
import warnings

import numpy as np
import pytest

from numbackend import codegen

# Builds, in a new process, tanh(a) followed by `steps` times (* 2 + 1) for each
# argument (a different kernel for each), and prints for each whether it matches
# NumPy and the file of its kernel module.
BUILD_TANH_CHAINS = textwrap.dedent("""
    import sys
    import numpy as np
    import numbackend as K
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    a = K.placeholder((None, 4))
    for steps in map(int, sys.argv[1:]):
        y, expected = K.tanh(a), np.tanh(x.astype(np.float64))
        for _ in range(steps):
            y, expected = y * 2.0 + 1.0, expected * 2 + 1
        f = K.function([a], [y])
        [kernel] = f.plan.kernels
        print(np.allclose(f([x])[0], expected, rtol=1e-5), kernel.__file__)
""")


def build_tanh_chains(cache, *steps):
    """[(matches NumPy, kernel module file)] of BUILD_TANH_CHAINS run in a new process."""
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", BUILD_TANH_CHAINS, *map(str, steps)], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [(ok == "True", path) for ok, path in (line.split() for line in out.stdout.splitlines())]


@pytest.fixture(scope="module")
def tanh_chain_cache(tmp_path_factory):
    """A kernel cache holding the modules (and Numba's compiled code) of tanh chains
    of 1 and 2 steps, and the original bytes of each module."""
    cache = tmp_path_factory.mktemp("tanh-chains")
    built = build_tanh_chains(cache, 1, 2)
    assert [ok for ok, _ in built] == [True, True]
    return cache, [(os.path.relpath(path, cache), pathlib.Path(path).read_bytes()) for _, path in built]


def replace_tanh_with_exp(data):
    assert data.count(b"vm.tanh_f32(") == 2  # the serial and the parallel loop
    return data.replace(b"vm.tanh_f32(", b"vm.exp_f32(")


@pytest.mark.parametrize("corrupt", [
    replace_tanh_with_exp,                      # the same interface, another body
    lambda data: data[:len(data) // 2],         # truncated
    lambda data: b"",                           # emptied
    lambda data: bytes(range(256)) * 8,         # garbled
], ids=["body-changed", "truncated", "emptied", "garbled"])
def test_a_changed_kernel_module_is_rewritten_and_compiled_again(tanh_chain_cache, tmp_path, corrupt):
    original, modules = tanh_chain_cache
    cache = tmp_path / "cache"
    shutil.copytree(original, cache)
    name, data = modules[0]
    (cache / name).write_bytes(corrupt(data))
    [(ok, path)] = build_tanh_chains(cache, 1)
    assert ok
    assert os.path.relpath(path, cache) == name and pathlib.Path(path).read_bytes() == data


def unique_kernel_source():
    """The source of a kernel module that no other test loads: tanh(x) + 1 for a
    float64 array, compiled through njit_cached."""
    return textwrap.dedent(f"""\
        # {uuid.uuid4().hex}
        import numpy as np
        from jit_kernels import njit_cached


        @njit_cached()
        def tanh_plus_one(x):
            return np.tanh(x) + 1.0
    """)


def test_rewriting_a_kernel_module_deletes_its_numba_cache_files(tmp_path, monkeypatch):
    # Numba matches its cached code to a source file by the file's stamp, which
    # before Numba 0.68 was its modification time and size: the compiled code of
    # a corrupt module must not outlive it
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))
    source = unique_kernel_source()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folder = codegen.cache_dir()
    pycache = os.path.join(folder, "__pycache__")
    os.makedirs(pycache, exist_ok=True)
    key = codegen.load_kernel(source).KEY
    module_path = os.path.join(folder, f"k_{key}.py")
    with open(module_path, "w") as f:
        f.write(source.replace("np.tanh", "np.exp"))
    stale = [f"k_{key}.tanh_plus_one-7.py311.nbi", f"k_{key}.tanh_plus_one-7.py311.1.nbc"]
    other = "k_0123456789abcdef01234567.tanh_plus_one-7.py311.nbi"
    for name in stale + [other]:
        open(os.path.join(pycache, name), "wb").close()
    codegen._modules.pop(key)  # as in a new process
    module = codegen.load_kernel(source)
    assert pathlib.Path(module_path).read_text() == source
    assert sorted(os.listdir(pycache)) == [other]
    x = np.linspace(-3, 3, 7)
    np.testing.assert_allclose(module.tanh_plus_one(x), np.tanh(x) + 1)


class _FileWaitingOnOthers:
    """A file whose first write waits until the other threads have each opened theirs."""

    def __init__(self, file, barrier):
        self.file, self.barrier = file, barrier

    def write(self, data):
        self.barrier.wait(timeout=10)
        return self.file.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.file.__exit__(*exc)


def test_threads_writing_one_new_kernel_module_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))
    threads = 4
    barrier = threading.Barrier(threads)

    def open_waiting_on_others(file, mode="r", *args, **kwargs):
        opened = open(file, mode, *args, **kwargs)  # noqa: SIM115 - closed by the caller
        return opened if "r" in mode else _FileWaitingOnOthers(opened, barrier)

    monkeypatch.setattr(codegen, "open", open_waiting_on_others, raising=False)
    source = unique_kernel_source()
    modules, errors = [], []

    def load():
        try:
            modules.append(codegen.load_kernel(source))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=load) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == [] and len(modules) == threads
    folder = codegen.cache_dir()
    assert [n for n in os.listdir(folder) if n != "__pycache__"] == [f"k_{modules[0].KEY}.py"]
    with open(os.path.join(folder, f"k_{modules[0].KEY}.py")) as f:
        assert f.read() == source
    x = np.linspace(-3, 3, 7)
    for module in modules:
        np.testing.assert_allclose(module.tanh_plus_one(x), np.tanh(x) + 1)
