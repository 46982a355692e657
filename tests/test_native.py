"""Native entries (numbackend/native.py): a function's inference plan exported
into the cache by one process and served by the next without Numba.

The processes here run a small MLP (and a function with Keras's learning phase)
with the entries on; results are checked against NumPy's formulas."""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from numbackend import native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# argv: a mode ("plain", "assign", "phase"), then the number of calls.  Prints
# what the first call ran on and the outputs.
SCRIPT = r"""
import json, sys
import numpy as np
import numbackend as K
mode, calls = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
w1 = rng.standard_normal((6, 5)).astype("float32")
w2 = rng.standard_normal((5, 3)).astype("float32")
x = K.placeholder((None, 6))
v1, v2 = K.variable(w1), K.variable(w2)
h = K.softmax(K.dot(K.relu(K.dot(x, v1)), v2))
if mode == "phase":
    h = K.in_train_phase(h * 2.0, h * 3.0)
    f = K.function([x, K.learning_phase()], [h])
    feed = lambda data, phase=0: f([data, phase])
else:
    f = K.function([x], [h])
    feed = lambda data: f([data])
data = np.linspace(-1, 1, 12, dtype="float32").reshape(2, 6)
from numbackend import native
out = {"native": f._native is not None, "outputs": [], "native_after": [],
       "key": native.key_of(f)[0]}
for i in range(calls):
    out["outputs"].append(feed(data)[0].tolist())
    out["native_after"].append(f._native is not None)
    if i == 0:
        out["numba_after_first"] = "numba" in sys.modules
if mode == "assign":
    K.set_value(v1, w1 * 2)
    out["after_assign"] = feed(data)[0].tolist()
    out["native_after_assign"] = f._native is not None
if mode == "phase":
    out["phase_1"] = feed(data, 1)[0].tolist()
print(json.dumps(out))
"""


def mlp(data, w1, w2):
    h = np.maximum(data @ w1, 0) @ w2
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def weights():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((6, 5)).astype("float32"),
            rng.standard_normal((5, 3)).astype("float32"))


DATA = np.linspace(-1, 1, 12, dtype="float32").reshape(2, 6)


def run(cache, mode="plain", calls=3, **environment):
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(cache), NUMBACKEND_TUNE_NATIVE_TIER="on",
               NUMBACKEND_TUNE_TIER_COMPILE="in_call", NUMBACKEND_TUNE_ONE_CALL_AFTER="2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **environment)
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(calls)], env=env, cwd=str(cache),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def wait_for_build(cache, timeout=300):
    """The native folder's entries and refusals once no build is under way."""
    folder = os.path.join(cache, "native")
    start = time.time()
    while time.time() - start < timeout:
        if not glob.glob(os.path.join(folder, "*.building")):
            names = os.listdir(folder) if os.path.isdir(folder) else []
            return ([n for n in names if "." not in n],
                    [n for n in names if n.endswith(".refused")])
        time.sleep(0.2)
    raise AssertionError(f"no build ended in {timeout} s: {os.listdir(folder)}")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(a cache whose native folder holds the entries of the plain and the
    learning-phase functions, each built by a first process, their keys)."""
    cache = tmp_path_factory.mktemp("native-cache")
    keys = {}
    for mode in ("plain", "phase"):
        first, _ = run(cache, mode)
        assert not first["native"]
        entries, refused = wait_for_build(cache)
        assert not refused, (cache / "native" / refused[0]).read_text()
        keys[mode] = first["key"]
    assert sorted(entries) == sorted(keys.values())
    return cache, keys


def copy_of(built, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(built[0], cache)
    return cache


def test_a_later_process_serves_from_the_entry_without_loading_numba(built, tmp_path):
    cache = copy_of(built, tmp_path)
    entry = cache / "native" / built[1]["plain"]
    os.utime(entry, (1e9, 1e9))
    result, _ = run(cache, calls=4)
    assert result["native"] and not result["numba_after_first"]
    assert entry.stat().st_mtime > 1e9 + 1  # marked used: the last that trim removes
    want = mlp(DATA, *weights())
    for got in result["outputs"]:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_the_entry_leaves_for_the_plan_after_one_call_after_calls(built, tmp_path):
    # with ONE_CALL_AFTER=2 and in-call tiers, the second call loads the plan and its
    # whole call (in the call, where the default is in the background) and leaves the entry
    cache = copy_of(built, tmp_path)
    result, _ = run(cache, calls=5)
    assert result["native"] and result["native_after"] == [True, False, False, False, False]
    want = mlp(DATA, *weights())
    for got in result["outputs"]:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_an_entry_in_a_read_only_seed_serves(built, tmp_path):
    # a container image's seed: its entries are read where another cache is written
    seed = copy_of(built, tmp_path)
    for folder, _, files in os.walk(seed):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)
    writable = tmp_path / "writable"
    writable.mkdir()
    try:
        result, _ = run(writable, calls=1, NUMBACKEND_CACHE_SEED=str(seed))
    finally:
        for folder, _, _ in os.walk(seed):
            os.chmod(folder, 0o755)
    assert result["native"] and not result["numba_after_first"]
    np.testing.assert_allclose(result["outputs"][0], mlp(DATA, *weights()), rtol=1e-5, atol=1e-7)


def test_an_assignment_after_the_lookup_leaves_the_entry(built, tmp_path):
    cache = copy_of(built, tmp_path)
    result, _ = run(cache, mode="assign", calls=1)
    assert result["native"] and not result["native_after_assign"]
    w1, w2 = weights()
    np.testing.assert_allclose(result["after_assign"], mlp(DATA, w1 * 2, w2), rtol=1e-5, atol=1e-7)


def test_the_learning_phase_picks_the_entry_at_0_and_the_plan_at_1(built, tmp_path):
    cache = copy_of(built, tmp_path)
    result, _ = run(cache, mode="phase", calls=1)
    assert result["native"] and not result["numba_after_first"]
    want = mlp(DATA, *weights())
    np.testing.assert_allclose(result["outputs"][0], want * 3, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result["phase_1"], want * 2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("damage", ["garbled weights", "cut library", "no hashes"])
def test_a_damaged_entry_is_not_used_and_built_again(built, tmp_path, damage):
    cache = copy_of(built, tmp_path)
    key = built[1]["plain"]
    entry = cache / "native" / key
    if damage == "garbled weights":
        data = bytearray((entry / "weights.bin").read_bytes())
        data[-20] ^= 0xFF
        (entry / "weights.bin").write_bytes(bytes(data))
    elif damage == "cut library":
        data = (entry / "model.so").read_bytes()
        (entry / "model.so").write_bytes(data[:len(data) // 2])
    else:
        (entry / "hashes.json").unlink()
    result, stderr = run(cache, calls=3)
    assert not result["native"]
    assert "is not used" in stderr
    want = mlp(DATA, *weights())
    for got in result["outputs"]:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    entries, _ = wait_for_build(cache)  # removed, and built again by this process
    assert key in entries and (entry / "hashes.json").exists()


def test_a_refused_export_is_not_tried_again(tmp_path):
    # scaled by the largest input of the whole batch: it mixes rows, which an
    # export refuses (it runs a batch in chunks), where a whole call does not
    script = SCRIPT.replace("h = K.softmax(K.dot(K.relu(K.dot(x, v1)), v2))",
                            "h = K.dot(x, v1) * K.max(x)")
    cache = tmp_path / "cache"
    cache.mkdir()
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(cache), NUMBACKEND_TUNE_NATIVE_TIER="on",
               NUMBACKEND_TUNE_TIER_COMPILE="in_call", NUMBACKEND_TUNE_ONE_CALL_AFTER="2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for attempt in range(2):
        done = subprocess.run([sys.executable, "-c", script, "plain", "3"], env=env,
                              cwd=str(cache), capture_output=True, text=True, timeout=600,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        entries, refused = wait_for_build(cache)
        assert entries == [] and len(refused) == 1
        if attempt == 0:
            mark = cache / "native" / refused[0]
            assert "ExportError" in mark.read_text()
            written = mark.stat().st_mtime_ns
    assert mark.stat().st_mtime_ns == written  # the second process started no build
    assert not list((cache / "native").glob("*.pickle"))


def test_a_build_trims_the_folder_to_its_budget_keeping_its_own_entry(built, tmp_path):
    cache = copy_of(built, tmp_path)
    script = SCRIPT.replace("h = K.softmax(K.dot(K.relu(K.dot(x, v1)), v2))",
                            "h = K.softmax(K.dot(K.relu(K.dot(x, v1)), v2) * 2.0)")
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(cache), NUMBACKEND_TUNE_NATIVE_TIER="on",
               NUMBACKEND_TUNE_TIER_COMPILE="in_call", NUMBACKEND_TUNE_ONE_CALL_AFTER="2",
               NUMBACKEND_TUNE_NATIVE_CACHE_MAX_BYTES="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", script, "plain", "3"], env=env, cwd=str(cache),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    new_key = json.loads(done.stdout.strip().splitlines()[-1])["key"]
    entries, refused = wait_for_build(cache)
    assert not refused and entries == [new_key]
    assert os.listdir(cache / "native") == [new_key]  # nothing half-removed left


def test_trim_removes_the_least_recently_used_entries_first(tmp_path, tuned):
    for age, name in enumerate(["newest", "middle", "oldest", "kept"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.bin").write_bytes(bytes(1000))
        used = time.time() - 100 * age
        os.utime(tmp_path / name, (used, used))
    (tmp_path / "other.refused").write_text("not an entry")
    # what a removal that rmtree could not finish, and builds, left
    for name in (".gone.7.removed", ".dead.8.staging", ".live.9.staging"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.bin").write_bytes(bytes(10))
    old = time.time() - 3600
    os.utime(tmp_path / ".dead.8.staging", (old, old))
    tuned(NATIVE_CACHE_MAX_BYTES=2500, NATIVE_BUILD_STALE_S=600)
    native.trim(str(tmp_path), keep="kept")  # the oldest, yet just built
    assert sorted(os.listdir(tmp_path)) == [".live.9.staging", "kept", "newest", "other.refused"]


def test_a_process_that_trained_builds_no_entry(monkeypatch, tuned):
    import threading

    import numbackend as K
    tuned(NATIVE_TIER="on", ONE_CALL_AFTER=1)
    monkeypatch.setattr(native, "_trained", False)
    started = []
    monkeypatch.setattr(native, "_start_build_or_warn", started.append)
    x = K.placeholder((None, 2))
    v = K.variable(np.zeros(2, "float32"))
    ones = [np.ones((1, 2), "float32")]

    def due():
        f = K.function([x], [x * v])
        for _ in range(3):
            f(ones)
        for thread in threading.enumerate():
            if thread.name == "numbackend-native":
                thread.join()
        return f

    before = due()
    train = K.function([x], [x * 2.0], updates=[(v, v + 1.0)])
    train(ones)
    due()
    assert started == [before]


def test_the_key_is_the_same_for_the_same_graph_and_values_however_made(tmp_path):
    import numbackend as K

    def function(w, extra_nodes=0):
        for _ in range(extra_nodes):  # moves the process's node counter on
            K.constant(1.0) + 1.0
        x = K.placeholder((None, 4))
        return K.function([x], [K.tanh(K.dot(x, K.variable(w)))])

    w = np.arange(12, dtype="float32").reshape(4, 3)
    np.save(tmp_path / "w.npy", w)
    first, _ = native.key_of(function(w))
    again, _ = native.key_of(function(np.load(tmp_path / "w.npy"), extra_nodes=5))
    other, _ = native.key_of(function(w + 1))
    assert first is not None and first == again
    assert other != first


def test_a_build_mark_is_taken_over_only_when_stale(tmp_path, tuned):
    tuned(NATIVE_BUILD_STALE_S=60)
    assert native._claim(str(tmp_path), "k")
    assert not native._claim(str(tmp_path), "k")  # under way
    old = time.time() - 120
    os.utime(tmp_path / "k.building", (old, old))
    assert native._claim(str(tmp_path), "k")


def test_a_function_with_updates_has_no_entry(monkeypatch, tuned):
    import numbackend as K
    tuned(NATIVE_TIER="on", ONE_CALL_AFTER=1)
    started = []
    monkeypatch.setattr(native, "build_later", started.append)
    x = K.placeholder((None, 2))
    v = K.variable(np.zeros(2, "float32"))
    with_updates = K.function([x], [x * 2.0], updates=[(v, v + 1.0)])
    without = K.function([x], [x * 2.0])
    for _ in range(3):
        with_updates([np.ones((1, 2), "float32")])
        without([np.ones((1, 2), "float32")])
    assert started == [without]


def test_warmup_builds_the_entry_once(monkeypatch, tuned):
    import numbackend as K
    tuned(NATIVE_TIER="on")
    built_now = []
    monkeypatch.setattr(native, "build_now", built_now.append)
    x = K.placeholder((None, 3))
    f = K.function([x], [K.exp(x)])
    f.warmup((1, 2))
    f.warmup((1,))
    assert built_now == [f]
