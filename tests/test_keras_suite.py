"""Keras 2.2.5's own tests, run against numbackend by tests/keras_suite.py (the fast subset).

The whole suite is run with ``python tests/keras_suite.py``; see that file."""
import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("keras") is None:
    pytest.skip("Keras 2.2.5 comes with the test extra", allow_module_level=True)

from tests import keras_suite

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def sdist():
    try:
        return keras_suite.sdist_folder()
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"pip could not fetch Keras {keras_suite.KERAS_VERSION}'s sources: {e}")


def test_every_patch_applies(sdist, tmp_path):
    keras_suite.prepare(sdist, str(tmp_path))  # raises SystemExit naming a patch that fails
    for path, _old, new, _reason in keras_suite.PATCHES:
        with open(tmp_path / path, encoding="utf-8") as f:
            assert new in f.read(), path


def test_every_deselected_test_exists(sdist):
    for node in keras_suite.DESELECTED:
        path, _, name = node.partition("::")
        function = name.split("::")[-1].split("[")[0]
        with open(os.path.join(sdist, path), encoding="utf-8") as f:
            assert f"def {function}(" in f.read(), node
    for path in keras_suite.EXCLUDED:
        assert os.path.exists(os.path.join(sdist, path)), path


@pytest.mark.parametrize("part", range(len(keras_suite.FAST_PARTS)))
def test_fast_subset_passes(sdist, part):
    # In a child process: Keras must be imported with KERAS_BACKEND=numbackend.
    result = subprocess.run([sys.executable, os.path.join(HERE, "keras_suite.py"),
                             *keras_suite.FAST_PARTS[part], "-q", "-x"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
