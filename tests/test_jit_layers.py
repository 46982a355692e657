"""jit_kernels' imports: no cycle between its modules (imports inside functions
counted), and none of numbackend, which is built on it."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jit_kernels"
MODULES = {path.stem for path in PACKAGE.glob("*.py")}


def imports_of(path):
    """The jit_kernels modules (by name) and the top-level packages outside it
    that ``path`` imports, anywhere in the file."""
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "jit_kernels":
                    inside.update(parts[1:2] or ["__init__"])
                else:
                    outside.add(parts[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").startswith("jit_kernels"):
                outside.add(node.module.split(".")[0])
                continue
            module = (node.module or "") if node.level else node.module.partition(".")[2]
            if module:
                inside.add(module.split(".")[0])
            else:  # from . import a, b: modules, or names of the package's __init__
                inside.update(a.name if a.name in MODULES else "__init__" for a in node.names)
    inside.discard(path.stem)
    return inside, outside


def import_graph():
    return {path.stem: imports_of(path)[0] for path in PACKAGE.glob("*.py")}


def find_cycle(graph):
    """A list of modules forming a cycle in ``graph`` ({module: imported}), or None."""
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                return stack[stack.index(imported):] + [imported]
            if imported not in state:
                found = visit(imported)
                if found:
                    return found
        state[module] = "done"
        stack.pop()
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_import_reader_counts_imports_inside_functions(tmp_path):
    path = tmp_path / "example.py"
    path.write_text("from . import blas, tuning\n\ndef f():\n    from .pool import max_pool_forward\n"
                    "    import numbackend.ops\n")
    assert imports_of(path) == ({"blas", "tuning", "pool"}, {"numbackend"})


def test_jit_kernels_modules_import_no_cycle():
    assert find_cycle(import_graph()) is None


def test_jit_kernels_never_imports_numbackend():
    importers = sorted(path.name for path in PACKAGE.glob("*.py") if "numbackend" in imports_of(path)[1])
    assert importers == []
