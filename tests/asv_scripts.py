"""asv_bench's command-line scripts, loaded by path for their tests (asv_bench
is not a package on the tests' path)."""
import importlib.util
import os

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "asv_bench")


def load(name, module_name=None):
    """The script ``asv_bench/<name>.py`` run as a new module (``module_name``,
    default ``name``)."""
    spec = importlib.util.spec_from_file_location(module_name or name, os.path.join(FOLDER, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
