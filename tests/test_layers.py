"""The packages' import graph: layers from the bottom, no cycles, no
reaching into another module's private names.

Imports inside functions count: a cycle held together by a function-level
import is still a cycle for whoever reads the code."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# numbackend's layers, bottom first: a module imports only from its own layer
# or below (see ARCHITECTURE.md).  jit_kernels is below all of them.
LAYERS = [
    ("graph and ops", {"config", "cpus", "names", "tuning", "tiers", "graph", "ops", "evaluator"}),
    ("autodiff", {"autodiff"}),
    ("compile", {"rewrite", "partition", "lowering", "program"}),
    ("code generation", {"codegen", "compiled_plan", "scan_loop", "scan_blocks", "plan"}),
    ("runtime", {"runtime", "native"}),
    ("API", {"core", "math", "nn", "conv", "rnn", "ctc", "random", "sparse", "updates",
             "keras1", "keras_compat", "batch_inference", "compile_report", "exporting",
             "export_files", "__init__",
             "__main__"}),
]


def _modules(package):
    """{dotted name: path} of a package's modules."""
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(name, path, modules):
    """The modules of ``modules`` that module ``name`` imports, anywhere in it,
    and the private names it takes from them: [(module, private name or None)]."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    found, bound = [], {}  # bound: local name -> the module imported as it
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    found.append((submodule, None))
                    bound[alias.asname or alias.name] = submodule
                elif base in modules:
                    found.append((base, alias.name if _private(alias.name) else None))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.append((alias.name, None))
                    if alias.asname:
                        bound[alias.asname] = alias.name
    for node in ast.walk(tree):  # module.private_name
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound and _private(node.attr)):
            found.append((bound[node.value.id], node.attr))
    return [(m, private) for m, private in found if m != name]


def _private(attribute):
    return attribute.startswith("_") and not attribute.startswith("__")


def _graph(package):
    modules = _modules(package)
    return modules, {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph):
    """The strongly connected components of more than one module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


@pytest.mark.parametrize("package", ["numbackend", "jit_kernels"])
def test_no_import_cycles(package):
    _, graph = _graph(package)
    assert _cycles(graph) == []


@pytest.mark.parametrize("package", ["numbackend", "jit_kernels"])
def test_no_module_takes_another_modules_private_names(package):
    _, graph = _graph(package)
    taken = sorted((name, module, private) for name, edges in graph.items()
                   for module, private in edges if private is not None)
    assert taken == []


def test_jit_kernels_never_imports_numbackend():
    modules = _modules("jit_kernels")
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level:
                assert not (node.module or "").startswith("numbackend"), name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("numbackend") for a in node.names), name


def _layer(name):
    top = name.split(".")[1] if "." in name else "__init__"
    for k, (_, members) in enumerate(LAYERS):
        if top in members:
            return k
    raise AssertionError(f"{name} is in no layer of tests/test_layers.py")


def test_numbackend_imports_only_from_its_layer_or_below():
    _, graph = _graph("numbackend")
    upward = [(name, module, LAYERS[_layer(name)][0], LAYERS[_layer(module)][0])
              for name, edges in graph.items() for module, _ in edges
              if _layer(module) > _layer(name)]
    assert upward == []


def test_the_layer_check_sees_an_upward_import(tmp_path):
    # the check itself: a module of the bottom layer importing the runtime is caught
    modules = {"numbackend.graph": tmp_path / "graph.py", "numbackend.runtime": tmp_path / "runtime.py"}
    modules["numbackend.graph"].write_text("def f():\n    from .runtime import Function\n")
    modules["numbackend.runtime"].write_text("from . import graph\n")
    graph = {n: _imports(n, p, modules) for n, p in modules.items()}
    assert graph["numbackend.graph"] == [("numbackend.runtime", None)]
    assert _cycles(graph) == [["numbackend.graph", "numbackend.runtime"]]
