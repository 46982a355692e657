"""The kernel cache: entries checked against the source they were written from,
concurrent writers, the choice of a folder no one else can write, and a disk
that cannot take more (the cache is skipped, the call computes)."""
import errno
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
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


LOAD_A_CACHED_KERNEL_OF = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import cached_kernel
    print(cached_kernel.f(1.0))
    stats = cached_kernel.f.stats
    print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
""")


def test_compiled_code_is_keyed_by_the_bytes_of_its_source_file(tmp_path):
    # Before Numba 0.68 a source file's stamp was its modification time and size:
    # a file rewritten with other bytes of the same size and time (a kernel
    # module rewritten after it was found corrupt) ran the old file's code
    source = tmp_path / "cached_kernel.py"
    # no bytecode: Python's own (keyed by time and size) would run the old file's code
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1")

    def write(body):
        source.write_text("from jit_kernels import njit_cached\n\n\n"
                          f"@njit_cached()\ndef f(x):\n    return {body}\n")
        os.utime(source, ns=(10**18, 10**18))

    def run():
        out = subprocess.run([sys.executable, "-c", LOAD_A_CACHED_KERNEL_OF, str(tmp_path)],
                             env=env, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    write("x + 1.0")
    assert run() == ["2.0", "0", "1"]
    assert run() == ["2.0", "1", "0"]
    write("x + 2.0")  # the same size and time
    assert run() == ["3.0", "0", "1"]


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


def test_threads_saving_one_compiled_code_entry_at_once(tmp_path, monkeypatch):
    # each writer has a temporary file of its own, renamed over the entry: a name
    # shared by the threads of a process (path.<pid>.tmp) was renamed away by the
    # first, and the others failed (FileNotFoundError)
    from jit_kernels import cache_folders, compiling
    threads = 4
    barrier = threading.Barrier(threads)

    def open_waiting_on_others(file, mode="r", *args, **kwargs):
        opened = open(file, mode, *args, **kwargs)  # noqa: SIM115 - closed by the caller
        return opened if "r" in mode else _FileWaitingOnOthers(opened, barrier)

    monkeypatch.setattr(cache_folders, "open", open_waiting_on_others, raising=False)
    entry = tmp_path / "entry.nbc"
    errors = []

    def save(i):
        try:
            compiling.write_atomically(str(entry), f"entry of thread {i}".encode() * 1000)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=save, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert os.listdir(tmp_path) == ["entry.nbc"]
    assert entry.read_bytes() in [f"entry of thread {i}".encode() * 1000 for i in range(threads)]


# --- the choice of the folder ---------------------------------------------------


@pytest.fixture
def temporary_folder(tmp_path, monkeypatch):
    """The system's temporary folder, moved to a folder of this test, with
    NUMBACKEND_CACHE_DIR naming a folder that cannot be created (under a file)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    return temporary


def owned_by_us_alone(folder):
    st = os.lstat(folder)
    return os.path.isdir(folder) and not os.path.islink(folder) and st.st_uid == os.getuid() and \
        st.st_mode & 0o077 == 0


def test_an_unwritable_configured_folder_is_named_in_one_warning(temporary_folder):
    configured = os.environ["NUMBACKEND_CACHE_DIR"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = codegen.cache_dir()
        assert codegen.cache_dir() == first
    assert len(caught) == 1 and re.search(f"{re.escape(configured)} cannot be used", str(caught[0].message))
    fallback = temporary_folder / f"numbackend-{os.getuid()}"
    assert first.startswith(str(fallback) + os.sep) and owned_by_us_alone(fallback)
    assert owned_by_us_alone(first)


def _owned_by_another_user(folder):
    if os.getuid() != 0:
        pytest.skip("giving a folder to another user takes root")
    os.chown(folder, 12345, -1)


def _writable_by_others(folder):
    os.chmod(folder, 0o777)


def _a_link_to_another_folder(folder):
    target = folder + "-target"
    os.rename(folder, target)
    os.symlink(target, folder)


@pytest.mark.parametrize("plant", [_owned_by_another_user, _writable_by_others, _a_link_to_another_folder],
                         ids=["another-owner", "writable-by-others", "symbolic-link"])
def test_a_fallback_folder_made_by_another_user_is_not_used(temporary_folder, plant):
    # <tmp>/numbackend-<uid> is a name anyone can create first; its kernels and
    # Numba's pickles there would run in this process
    planted = str(temporary_folder / f"numbackend-{os.getuid()}")
    with pytest.warns(UserWarning):
        planted_cache = codegen.cache_dir()  # made as an attacker would, with a cache inside
    plant(planted)
    with pytest.warns(UserWarning, match=re.escape(planted)):
        folder = codegen.cache_dir()
    assert not folder.startswith(planted) and not folder.startswith(os.path.realpath(planted))
    assert owned_by_us_alone(folder) and owned_by_us_alone(os.path.dirname(folder))
    assert codegen.cache_dir() == folder  # one private folder for the process
    assert os.path.basename(folder) == os.path.basename(planted_cache)


@pytest.mark.parametrize("shared", ["folder", "compiled-code"])
def test_a_configured_folder_others_can_write_is_not_used(tmp_path, monkeypatch, shared):
    # Numba loads pickles from the compiled-code folder: whoever can write there
    # runs code in this process
    from jit_kernels import compiling
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path / "cache"))

    def folder():
        if shared == "folder":
            return codegen.cache_dir()
        return compiling.usable_folder("numba", compiling.target_key())

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        os.chmod(folder(), 0o777)
    with pytest.warns(UserWarning, match=f"{re.escape(str(tmp_path / 'cache'))} cannot be used"):
        assert not folder().startswith(str(tmp_path / "cache"))


# --- a full disk ----------------------------------------------------------------


def open_on_a_full_disk(file, mode="r", *args, **kwargs):
    """``open``, whose files opened for writing take no byte."""
    opened = open(file, mode, *args, **kwargs)  # noqa: SIM115 - closed by the caller, or below
    if "r" in mode:
        return opened
    opened.close()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_kernel_module_that_cannot_be_written_is_run_from_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))
    from jit_kernels import cache_folders
    monkeypatch.setattr(cache_folders, "open", open_on_a_full_disk, raising=False)  # its writes
    source = unique_kernel_source()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = codegen.load_kernel(source)
        assert codegen.load_kernel(unique_kernel_source()) is not module
    assert len(caught) == 1 and "No space left on device" in str(caught[0].message)
    assert os.listdir(codegen.cache_dir()) == []
    x = np.linspace(-3, 3, 7)
    np.testing.assert_allclose(module.tanh_plus_one(x), np.tanh(x) + 1)


def test_compiled_code_that_cannot_be_saved_is_used_unsaved(tmp_path, monkeypatch):
    # Numba saves compiled code inside the call that compiles it
    from jit_kernels import compiling
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))

    write = compiling.write_atomically

    def save_on_a_full_disk(path, data):  # kernel modules are written, compiled code is not
        if not path.endswith(".py"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(path, data)

    monkeypatch.setattr(compiling, "write_atomically", save_on_a_full_disk)
    module = codegen.load_kernel(unique_kernel_source())
    x = np.linspace(-3, 3, 7)
    with pytest.warns(UserWarning, match="No space left on device"):
        np.testing.assert_allclose(module.tanh_plus_one(x), np.tanh(x) + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(module.tanh_plus_one(x[:3]), np.tanh(x[:3]) + 1)
        np.testing.assert_allclose(module.tanh_plus_one(x.astype(np.float32)),
                                   np.tanh(x.astype(np.float32)) + 1, rtol=1e-6)


FULL_DISK = textwrap.dedent("""
    import errno, os, sys, warnings
    import numpy as np
    import numbackend as K
    from jit_kernels import compiling
    from numbackend import codegen

    def open_on_a_full_disk(file, mode="r", *args, **kwargs):
        opened = open(file, mode, *args, **kwargs)
        if "r" in mode:
            return opened
        opened.close()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    write = compiling.write_atomically

    def write_on_a_full_disk(path, data):  # "numba": kernel modules are written
        if sys.argv[1] == "all" or not path.endswith(".py"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(path, data)

    compiling.write_atomically = write_on_a_full_disk
    if sys.argv[1] == "all":
        codegen.open = open_on_a_full_disk
    x = np.linspace(-2, 2, 12).reshape(3, 4)
    a = K.placeholder((None, 4), dtype="float64")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = K.function([a], [K.softmax(K.tanh(a) * 3.0 - 1.0)])
        for _ in range(2):
            e = np.exp(np.tanh(x) * 3 - 1)
            print(np.allclose(f([x])[0], e / e.sum(-1, keepdims=True)))
    messages = [str(w.message) for w in caught if "No space left on device" in str(w.message)]
    print(len(messages) >= 1 and len(messages) == len(set(messages)))
""")


@pytest.mark.parametrize("full", ["numba", "all"])
def test_a_full_disk_leaves_calls_computing_and_no_temporary_files(tmp_path, full):
    # "numba": the kernel module was written, Numba's larger compiled code was not;
    # "all": neither was
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", FULL_DISK, full], env=env, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    # each call computes; one warning for each folder that could not be written
    assert out.stdout.split() == ["True", "True", "True"], out.stderr
    left = [name for _, _, names in os.walk(tmp_path) for name in names]
    assert all(name.startswith("k_") and name.endswith(".py") for name in left)
    assert len(left) >= 1 if full == "numba" else left == []


def compiled_entries(cache, module_name):
    """The files of compiled code of the kernel module ``module_name`` (k_<key>.py)
    in the cache root ``cache``."""
    prefix = f"numbackend_kernels.{module_name[:-len('.py')]}."
    return sorted(path for path in pathlib.Path(cache, "numba").glob("*/*.nbc")
                  if path.name.startswith(prefix))


def flip_a_byte_in_the_middle(data, _):
    return data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1:]


@pytest.mark.parametrize("corrupt", [
    lambda data, _: data[:len(data) // 2],      # truncated
    lambda data, _: b"",                        # emptied
    lambda data, _: b"\x80\x04garbled",         # garbled
    flip_a_byte_in_the_middle,                  # one bit of the machine code
    lambda _, other: other,                     # another kernel's entry in its place
], ids=["truncated", "emptied", "garbled", "bit-flipped", "foreign"])
def test_a_corrupt_compiled_code_entry_is_compiled_again(tanh_chain_cache, tmp_path, corrupt):
    # a cut-short or garbled file of compiled code made every later process fail
    # to unpickle it; a valid pickle of corrupt or other code would have run
    original, modules = tanh_chain_cache
    cache = tmp_path / "cache"
    shutil.copytree(original, cache)
    entries = compiled_entries(cache, os.path.basename(modules[0][0]))
    [other] = compiled_entries(cache, os.path.basename(modules[1][0]))[:1]
    assert entries
    for entry in entries:
        entry.write_bytes(corrupt(entry.read_bytes(), other.read_bytes()))
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(cache))
    for expect_warning in (True, False):  # the entry saved anew loads in the next process
        # the other kernel's module first: its code could then be loaded as it is
        out = subprocess.run([sys.executable, "-c", BUILD_TANH_CHAINS, "2", "1"], env=env,
                             capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[::2] == ["True", "True"]
        assert ("unreadable cache entry" in out.stderr) == expect_warning, out.stderr


LOAD_A_CACHED_KERNEL = textwrap.dedent("""
    import sys
    import jit_kernels.compiling
    if sys.argv[2] != "as is":
        jit_kernels.compiling._package_stamp = sys.argv[2]  # as if another file of the package changed
    sys.path.insert(0, sys.argv[1])
    import cached_kernel
    cached_kernel.twice(1.5)
    stats = cached_kernel.twice.stats
    print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
""")


def test_a_jit_kernel_is_compiled_again_when_another_file_of_the_package_changes(tmp_path):
    # Numba checks only a function's own file, but kernels inline functions of
    # other files (conv.py packed.py's micro-kernels): stale machine code of an
    # unchanged file once corrupted the heap after another file changed
    source = tmp_path / "cached_kernel.py"
    source.write_text("from jit_kernels import njit_cached\n\n\n"
                      "@njit_cached()\ndef twice(x):\n    return 2 * x\n")
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(tmp_path / "cache"))

    def hits_and_misses(stamp):
        out = subprocess.run([sys.executable, "-c", LOAD_A_CACHED_KERNEL, str(tmp_path), stamp],
                             env=env, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert hits_and_misses("as is") == ["0", "1"]  # compiled and saved
    assert hits_and_misses("as is") == ["1", "0"]  # loaded
    assert hits_and_misses("another") == ["0", "1"]  # the package changed: compiled again
    assert hits_and_misses("another") == ["1", "0"]


def test_the_package_stamp_covers_every_source_file_of_jit_kernels():
    import hashlib

    import jit_kernels
    folder = os.path.dirname(jit_kernels.__file__)
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        # tuning.py: its compiled values below; manifest.py compiles kernels but holds none
        if name.endswith(".py") and name not in ("tuning.py", "manifest.py"):
            digest.update(name.encode() + b"\0" + pathlib.Path(folder, name).read_bytes())
    from jit_kernels import tuning
    digest.update(repr(tuning.compiled_values()).encode())
    assert jit_kernels.package_stamp() == digest.hexdigest()[:16]
