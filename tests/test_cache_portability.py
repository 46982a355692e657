"""The cache of compiled code is portable: a cache moved or copied elsewhere
(a container image) is used there; read-only seeds are read, misses go
elsewhere; a non-root user with a read-only install and no writable home (a
serverless function) runs from a seed without compiling; the CPU target, not
the host, keys compiled code.  Each case runs a new process on a copy of the
packages (its own install) and one small fused kernel."""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent

# Computes softmax(tanh(a) * 2) as one fused kernel (which calls jit_kernels'
# row reductions); prints whether it matches NumPy and how many functions Numba
# compiled in the process (0: all loaded).
PREDICT = textwrap.dedent("""
    import sys
    from numba.core import event

    compiles = []

    class Count(event.Listener):
        def on_start(self, event):
            compiles.append(event.data["dispatcher"])

        def on_end(self, event):
            pass

    event.register("numba:compile", Count())
    import numpy as np
    import numbackend as K
    from jit_kernels import compiling
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)

    def softmax_of_tanh():
        a = K.placeholder((None, 4))
        return K.function([a], [K.softmax(K.tanh(a) * 2.0)])([x])[0]

    if len(sys.argv) > 1:  # save under this cache root (a seed), the kernels' modules loaded too
        with compiling.saving_to(sys.argv[1]):
            y = softmax_of_tanh()
    else:
        y = softmax_of_tanh()
    e = np.exp(np.tanh(x.astype(np.float64)) * 2)
    print(np.allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5), len(compiles))
""")


def install_packages(folder):
    """A copy of numbackend and jit_kernels in ``folder`` (an install of their
    own, without any cache inside), for PYTHONPATH."""
    ignore = shutil.ignore_patterns("__pycache__", "_seed")
    for package in ("numbackend", "jit_kernels"):
        shutil.copytree(REPOSITORY / package, pathlib.Path(folder, package), ignore=ignore)
    return str(folder)


def clean_environment(**variables):
    """os.environ without numbackend's and Numba's cache and CPU settings, plus ``variables``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBACKEND_CACHE", "NUMBACKEND_CPU", "NUMBA_CACHE", "NUMBA_CPU",
                                "XDG_CACHE_HOME"))}
    env.update({k: str(v) for k, v in variables.items()})
    return env


def predict(env, *arguments, command=()):
    """(matches NumPy, compiles, stderr) of PREDICT run in a new process, in its
    HOME (``python -c`` imports from its folder first: not from this repository)."""
    out = subprocess.run([*command, sys.executable, "-c", PREDICT, *map(str, arguments)], env=env,
                         cwd=env["HOME"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    ok, compiles = out.stdout.split()
    return ok == "True", int(compiles), out.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A folder holding an install (src), its cache (cache) built by running
    PREDICT once, and a home; NUMBA_CACHE_DIR set as a user may set it (numba)."""
    folder = tmp_path_factory.mktemp("built")
    (folder / "home").mkdir()
    env = clean_environment(PYTHONPATH=install_packages(folder / "src"), HOME=folder / "home",
                            NUMBACKEND_CACHE_DIR=folder / "cache", NUMBA_CACHE_DIR=folder / "numba")
    ok, compiles, _ = predict(env)
    assert ok and compiles > 0
    return folder


def test_a_cache_copied_elsewhere_is_used_there(built, tmp_path):
    # Numba's own cache folders are named by a hash of each source file's
    # absolute path: an install and its cache built in one place missed in another
    moved = tmp_path / "elsewhere"
    shutil.copytree(built, moved, symlinks=True)
    env = clean_environment(PYTHONPATH=moved / "src", HOME=moved / "home",
                            NUMBACKEND_CACHE_DIR=moved / "cache", NUMBA_CACHE_DIR=moved / "numba")
    assert predict(env)[:2] == (True, 0)


@pytest.fixture
def world_readable_folder():
    """A new folder that any user can read and enter (pytest's own folders are
    private to this user), deleted after the test."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="numbackend-portability-"))
    folder.chmod(0o755)
    yield folder
    for path, folders, _ in os.walk(folder):  # give writes back, for a non-root owner
        for name in folders:
            os.chmod(os.path.join(path, name), 0o755)
    shutil.rmtree(folder)


def read_only(folder):
    """chmod -R a+rX,a-w ``folder``: readable by all, writable by none (what the
    serverless recipe does to a seed; a cache's own folders are private)."""
    for path, folders, files in os.walk(folder, topdown=False):
        for name in [*folders, *files]:
            target = os.path.join(path, name)
            if not os.path.islink(target):
                os.chmod(target, 0o555 if os.path.isdir(target) else 0o444)
    os.chmod(folder, 0o555)


def as_an_unprivileged_user():
    """The command prefix running a process as a user other than root: none where
    this process is not root, else setpriv to nobody's uid (skip without it)."""
    if os.getuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv to run the process as another user")
    return (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.mark.parametrize("seed_from", ["NUMBACKEND_CACHE_SEED", "NUMBACKEND_CACHE_DIR"])
def test_a_read_only_seed_serves_a_read_only_install_without_a_writable_home(
        built, world_readable_folder, seed_from):
    # the serverless recipe: a seed built beforehand and shipped read-only with a
    # read-only install, run as a user who can write neither, nor have a home;
    # importing jit_kernels there failed ("no locator available"), and a
    # read-only NUMBACKEND_CACHE_DIR was ignored
    folder = world_readable_folder
    shutil.copytree(built / "src", folder / "src")
    shutil.copytree(built / "cache", folder / "seed")
    (folder / "home").mkdir()
    (folder / "tmp").mkdir()
    (folder / "tmp").chmod(0o1777)  # misses, where any, go there
    for path in ("src", "seed", "home"):
        read_only(folder / path)
    env = clean_environment(PYTHONPATH=folder / "src", HOME=folder / "home", TMPDIR=folder / "tmp",
                            **{seed_from: folder / "seed"})
    ok, compiles, errors = predict(env, command=as_an_unprivileged_user())
    assert (ok, compiles) == (True, 0), errors


def test_code_saved_to_the_package_seed_is_used_with_an_empty_cache(tmp_path):
    # what `python -m numbackend warmup` does where the install can be written
    src = install_packages(tmp_path / "src")
    seed = pathlib.Path(src, "jit_kernels", "_seed")
    env = clean_environment(PYTHONPATH=src, HOME=tmp_path, NUMBACKEND_CACHE_DIR=tmp_path / "first")
    ok, compiles, _ = predict(env, seed)
    assert ok and compiles > 0 and (seed / "numba").is_dir()
    assert not (tmp_path / "first" / "numba").exists()
    # the seed serves other users: readable by all, writable by its owner alone
    saved = [seed, *seed.rglob("*")]
    assert all(path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644) for path in saved)
    env["NUMBACKEND_CACHE_DIR"] = str(tmp_path / "second")
    assert predict(env)[:2] == (True, 0)


def test_a_seed_others_can_write_is_not_read(built, tmp_path):
    # whoever can write to a seed can put pickles there that run in this process
    shutil.copytree(built / "cache", tmp_path / "seed")
    (tmp_path / "seed" / "numba").chmod(0o777)
    env = clean_environment(PYTHONPATH=built / "src", HOME=tmp_path,
                            NUMBACKEND_CACHE_SEED=tmp_path / "seed",
                            NUMBACKEND_CACHE_DIR=tmp_path / "cache")
    ok, compiles, errors = predict(env)
    assert ok and compiles > 0
    assert f"the cache seed {tmp_path / 'seed'} is not read (others can write to" in errors


# --- the CPU target -----------------------------------------------------------------

VECTOR_BYTES = "from jit_kernels import compiling, packed; print(packed.VECTOR_BYTES, compiling.target_key())"


@pytest.mark.parametrize("settings, vector_bytes", [
    ({"NUMBA_CPU_NAME": "generic"}, 32),
    ({"NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": "+avx512f"}, 64),
    ({"NUMBACKEND_CPU_TARGET": "x86-64-v3"}, 32),
    ({"NUMBACKEND_CPU_TARGET": "x86-64-v4"}, 64),
    ({"NUMBACKEND_CPU_TARGET": "skylake-avx512"}, 64),  # was 32: by name, x86-64-v4 alone
    ({"NUMBACKEND_CPU_TARGET": "znver3"}, 32),
], ids=["generic", "generic+avx512f", "x86-64-v3", "x86-64-v4", "skylake-avx512", "znver3"])
def test_the_packed_products_take_the_vector_width_of_the_cpu_target(settings, vector_bytes):
    # it was the host's, compiled into code that any host could load
    # under the same NUMBA_CPU_NAME
    env = clean_environment(PYTHONPATH=REPOSITORY, **settings)
    out = subprocess.run([sys.executable, "-c", VECTOR_BYTES], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    width, key = out.stdout.split()
    assert int(width) == vector_bytes
    assert key.startswith((settings.get("NUMBACKEND_CPU_TARGET") or settings["NUMBA_CPU_NAME"]) + "-")


def test_a_cache_for_a_cpu_family_is_kept_apart_from_the_hosts(tmp_path):
    import llvmlite.binding as llvm
    if not llvm.get_host_cpu_features().get("avx2"):
        pytest.skip("the host cannot run x86-64-v3 code (no AVX2)")
    family = clean_environment(PYTHONPATH=REPOSITORY, HOME=tmp_path, NUMBACKEND_CACHE_DIR=tmp_path,
                               NUMBACKEND_CPU_TARGET="x86-64-v3")
    ok, compiles, _ = predict(family)
    assert ok and compiles > 0
    assert [p.name.split("-")[:3] for p in (tmp_path / "numba").iterdir()] == [["x86", "64", "v3"]]
    assert predict(family)[:2] == (True, 0)
    host = dict(family)
    del host["NUMBACKEND_CPU_TARGET"]
    ok, compiles, _ = predict(host)
    assert ok and compiles > 0


def test_a_cpu_target_that_disagrees_with_numbas_is_refused():
    env = clean_environment(PYTHONPATH=REPOSITORY, NUMBACKEND_CPU_TARGET="x86-64-v3",
                            NUMBA_CPU_NAME="generic")
    out = subprocess.run([sys.executable, "-c", "import jit_kernels.compiling"], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert "NUMBACKEND_CPU_TARGET='x86-64-v3' and NUMBA_CPU_NAME='generic' disagree" in out.stderr


# --- concurrent writers -------------------------------------------------------------


def test_two_processes_compiling_the_same_new_kernels_at_once(tmp_path):
    env = clean_environment(PYTHONPATH=REPOSITORY, HOME=tmp_path, NUMBACKEND_CACHE_DIR=tmp_path)
    runs = [subprocess.Popen([sys.executable, "-c", PREDICT], env=env, cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for run in runs:
        out, errors = run.communicate(timeout=300)
        assert run.returncode == 0, errors
        assert out.split()[0] == "True"
    assert predict(env)[:2] == (True, 0)
    left = [name for _, _, names in os.walk(tmp_path) for name in names if name.endswith(".tmp")]
    assert left == []


def test_nothing_writable_compiles_in_memory_after_one_warning(tmp_path):
    # no writable cache folder at all (even the temporary folder): compile, never crash
    script = textwrap.dedent("""
        import warnings
        from jit_kernels import compiling

        def nowhere(*names):
            raise OSError("no folder can be written")

        compiling.usable_folder = nowhere
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
    """) + textwrap.indent(PREDICT, "    ") + textwrap.dedent("""
        print(sum("no folder can be written" in str(w.message) for w in caught))
    """)
    env = clean_environment(PYTHONPATH=REPOSITORY, HOME=tmp_path, NUMBACKEND_CACHE_DIR=tmp_path)
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    ok, compiles, warned = out.stdout.split()
    assert ok == "True" and int(compiles) > 0 and warned == "1"
    assert not any(files for _, _, files in os.walk(tmp_path))

