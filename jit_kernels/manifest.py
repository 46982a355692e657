"""The library's signature manifest: which kernels of this package models
compile, for which argument types, so that they can be compiled before a model
needs them (:func:`warmup`) and each compile timed (:func:`compile_entries`).

The manifest is ``signatures.txt`` next to this module, one entry a line::

    packed.matmul_packed (array(float32, 2, 'C'), array(float32, 2, 'C'), int64)

a kernel's name (its module in this package, then its qualified name; a
parallel kernel's serial twin ends in ``_serial``) and its argument types
written by :func:`signature_text`, which :func:`parse_signature` reads back
without evaluating the text.  A compiled part (parts.compiled_part, one fixed C
signature) has the signature ``part``.  ``python -m numbackend compile-report
--record`` writes the file from a set of workloads.

The file is data, not a module, so that recording it does not change
package_stamp (compiling.py), which would make every cache entry stale.
"""
import ast
import contextlib
import importlib
import json
import os
import subprocess
import sys
import threading
import time

from numba.core import event

MANIFEST_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "signatures.txt")

# The modules of this package that hold no kernels.
_NOT_KERNEL_MODULES = {"__init__", "compiling", "machine", "manifest", "tuning"}

PART_SIGNATURE = "part"


# -- Numba types as text -------------------------------------------------------

def _scalar_types():
    from numba import types
    scalars = (types.boolean, types.none, *types.integer_domain, *types.real_domain,
               *types.complex_domain)
    return {"voidptr": types.voidptr, **{str(t): t for t in scalars}}


def type_text(numba_type):
    """``numba_type`` as the text :func:`parse_type` reads back: ``float32``,
    ``array(float32, 2, 'C')``, ``array(float64, 1, 'A', readonly=True)``,
    ``UniTuple(int64, 3)``, ``Tuple(int64, float32)``, ``Omitted(None)``,
    ``Literal(False)``, ``CPointer(int64)``, ``voidptr``,
    ``NumberClass(float32)`` (a NumPy scalar type passed), ``DType(float32)``.
    Raises TypeError for a type outside these."""
    from numba import types
    if isinstance(numba_type, types.Array):
        text = f"array({type_text(numba_type.dtype)}, {numba_type.ndim}, {numba_type.layout!r}"
        if not numba_type.mutable:
            text += ", readonly=True"
        if not numba_type.aligned:
            text += ", aligned=False"
        return text + ")"
    if isinstance(numba_type, types.UniTuple):
        return f"UniTuple({type_text(numba_type.dtype)}, {numba_type.count})"
    if isinstance(numba_type, types.Tuple):
        return f"Tuple({', '.join(type_text(t) for t in numba_type.types)})"
    if isinstance(numba_type, types.Omitted):
        text = f"Omitted({numba_type.value!r})"
        try:
            if ast.literal_eval(text[len("Omitted("):-1]) == numba_type.value:
                return text
        except (ValueError, SyntaxError):
            pass
        raise TypeError(f"type_text: the default of {numba_type} is not a Python literal")
    if isinstance(numba_type, types.NumberClass):
        return f"NumberClass({type_text(numba_type.instance_type)})"
    if isinstance(numba_type, types.DType):
        return f"DType({type_text(numba_type.dtype)})"
    if isinstance(numba_type, types.CPointer):
        return f"CPointer({type_text(numba_type.dtype)})"
    if isinstance(numba_type, types.Literal):
        text = f"Literal({numba_type.literal_value!r})"
        if _literal(numba_type.literal_value) == numba_type:
            return text
        raise TypeError(f"type_text: the literal {numba_type} does not read back")
    for text, scalar in _scalar_types().items():
        if scalar == numba_type:
            return text
    raise TypeError(f"type_text: no text for the Numba type {numba_type} "
                    f"({type(numba_type).__name__}); add it to jit_kernels.manifest")


def signature_text(argument_types):
    """A tuple of Numba argument types as text: ``(float32, array(int64, 1, 'C'))``."""
    return "(" + ", ".join(type_text(t) for t in argument_types) + ")"


def parse_type(text):
    """The Numba type that :func:`type_text` wrote as ``text``."""
    return _type_of(_parse(text, "parse_type"), text)


def parse_signature(text):
    """The tuple of Numba types that :func:`signature_text` wrote as ``text``."""
    if not (text.startswith("(") and text.endswith(")")):
        raise ValueError(f"parse_signature: {text!r} is not a parenthesised list of types")
    node = _parse(text, "parse_signature")
    if not isinstance(node, ast.Tuple):  # "(int64)": one argument
        return (_type_of(node, text),)
    return tuple(_type_of(element, text) for element in node.elts)


def _parse(text, caller):
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"{caller}: cannot read {text!r}") from None


def _literal(value):
    """Numba's literal type of a bool, int, float or str, else None."""
    from numba import types
    if not isinstance(value, (bool, int, float, str)):
        return None
    return types.literal(value)


def _type_of(node, text):
    """The Numba type an expression node of :func:`type_text`'s grammar names;
    nothing is evaluated but literals."""
    from numba import types

    def fail(why):
        return ValueError(f"parse_type: {why} in {text!r}")

    if isinstance(node, ast.Name):
        scalar = _scalar_types().get(node.id)
        if scalar is None:
            raise fail(f"unknown type {node.id!r}")
        return scalar
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise fail(f"unexpected {ast.dump(node)}")
    def literal(value_node):
        try:
            return ast.literal_eval(value_node)
        except ValueError:
            raise fail(f"{ast.unparse(value_node)} is not a literal") from None

    name, args = node.func.id, node.args
    keywords = {k.arg: literal(k.value) for k in node.keywords}
    if name == "array":
        unknown = set(keywords) - {"readonly", "aligned"}
        if len(args) != 3 or unknown:
            raise fail("array(dtype, ndim, layout[, readonly=, aligned=]) expected")
        ndim, layout = literal(args[1]), literal(args[2])
        if not isinstance(ndim, int) or layout not in ("C", "F", "A"):
            raise fail(f"bad ndim {ndim!r} or layout {layout!r}")
        return types.Array(_type_of(args[0], text), ndim, layout,
                           readonly=bool(keywords.get("readonly", False)),
                           aligned=bool(keywords.get("aligned", True)))
    if keywords:
        raise fail(f"{name} takes no keywords")
    if name == "UniTuple" and len(args) == 2:
        count = literal(args[1])
        if not isinstance(count, int):
            raise fail(f"bad count {count!r}")
        return types.UniTuple(_type_of(args[0], text), count)
    if name == "Tuple":
        return types.Tuple(tuple(_type_of(a, text) for a in args))
    if name == "Omitted" and len(args) == 1:
        return types.Omitted(literal(args[0]))
    if name == "NumberClass" and len(args) == 1:
        return types.NumberClass(_type_of(args[0], text))
    if name == "DType" and len(args) == 1:
        return types.DType(_type_of(args[0], text))
    if name == "CPointer" and len(args) == 1:
        return types.CPointer(_type_of(args[0], text))
    if name == "Literal" and len(args) == 1:
        value = _literal(literal(args[0]))
        if value is None:
            raise fail("a literal of bool, int, float or str expected")
        return value
    raise fail(f"unknown constructor {name}({len(args)} arguments)")


# -- the kernels ---------------------------------------------------------------

def kernel_modules():
    """The names of this package's modules that define kernels, sorted."""
    folder = os.path.dirname(os.path.abspath(__file__))
    return sorted(name[:-3] for name in os.listdir(folder)
                  if name.endswith(".py") and name[:-3] not in _NOT_KERNEL_MODULES)


def kernels():
    """{name: kernel} of every disk-cached kernel of this package: the
    dispatchers declared with njit_cached (and their ``serial`` twins) and the
    compiled parts (parts.compiled_part), found in the modules' globals and in
    dicts there.  Imports every kernel module."""
    from numba.core.dispatcher import Dispatcher

    from .compiling import KernelCache
    found = {}

    def add(module, value):
        if isinstance(value, Dispatcher):
            function = value.py_func
            if (function.__module__ == module.__name__
                    and isinstance(getattr(value, "_cache", None), KernelCache)):
                found[_kernel_name(function)] = value
            twin = getattr(value, "serial", None)
            if twin is not None:
                add(module, twin)
        part_function = getattr(value, "part_function", None)
        if part_function is not None and part_function.__module__ == module.__name__:
            found[_kernel_name(part_function)] = value

    for short in kernel_modules():
        module = importlib.import_module(f"{__package__}.{short}")
        for value in list(vars(module).values()):
            for item in value.values() if isinstance(value, dict) else (value,):
                add(module, item)
    return found


def _kernel_name(function):
    return f"{function.__module__.rsplit('.', 1)[-1]}.{function.__qualname__}"


def compiled_signatures(kernel):
    """The signatures (as text) a kernel has compiled or loaded in this process."""
    if hasattr(kernel, "part_function"):
        return [PART_SIGNATURE] if kernel.cache_info().currsize else []
    return [signature_text(args) for args in kernel.signatures]


# -- the manifest file ---------------------------------------------------------

def read_manifest(path=MANIFEST_PATH):
    """[(kernel name, signature text)] of the manifest file, in its order."""
    entries = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, signature = line.partition(" ")
            if not signature:
                raise ValueError(f"read_manifest: {path}:{number}: no signature after {name!r}")
            entries.append((name, signature.strip()))
    return entries


def write_manifest(entries, path=MANIFEST_PATH):
    """Write [(kernel name, signature text)] as the manifest file, sorted."""
    lines = ["# Kernel signatures that models compile: a kernel of jit_kernels, then its",
             "# argument types (jit_kernels.manifest).  Written by",
             "# python -m numbackend compile-report --record; compiled by python -m numbackend warmup."]
    lines += [f"{name} {signature}" for name, signature in sorted(set(entries))]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# -- compiling -----------------------------------------------------------------

def compile_entries(entries, report=None):
    """Compile (or load from the cache) each (kernel name, signature text) of
    ``entries`` in this process, and time each compile.  Returns one dict a
    compile of a kernel of this package: kernel, signature, ``self_s``
    (seconds, less the compiles of this package's kernels nested in it; see
    :class:`_CompileTimes`) and ``inclusive_s``, ``entry`` (True for an entry of ``entries``,
    False for a kernel or helper compiled inside one), ``loaded`` (an entry
    found in the cache, or compiled inside an earlier one) and ``error`` (text, for an entry that failed).  Each
    entry's dict is passed to ``report`` when it is done."""
    import numba
    numba.njit(lambda x: x + 1)(1)  # Numba's own first-compile set-up, out of the times

    found = kernels()
    listener = _CompileTimes()
    rows = []
    with event.install_listener("numba:compile", listener):
        for name, signature in entries:
            row = {"kernel": name, "signature": signature, "entry": True, "loaded": False,
                   "error": None}
            listener.compiles = []
            start = time.perf_counter()
            try:
                row["loaded"] = _compile(found, name, signature)
            except Exception as error:  # noqa: BLE001 - reported, and the others go on
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
            row["inclusive_s"] = time.perf_counter() - start
            outer = [c for c in listener.compiles if c["depth"] == 0]
            own = [c for c in outer if c["kernel"] == name and c["signature"] == signature]
            # a compiled part's own compile is no numba:compile event: its time is the rest
            row["self_s"] = (own[0]["self_s"] if own else
                             row["inclusive_s"] - sum(c["inclusive_s"] for c in outer))
            rows.append(row)
            rows.extend({"kernel": c["kernel"], "signature": c["signature"], "entry": False,
                         "loaded": False, "error": None, "self_s": c["self_s"],
                         "inclusive_s": c["inclusive_s"]}
                        for c in listener.compiles if not own or c is not own[0])
            if report is not None:
                report(row)
    return rows


def _compile(found, name, signature):
    """Compile kernel ``name`` of ``found`` for ``signature``, or load it; returns
    whether it was loaded from the cache."""
    kernel = found.get(name)
    if kernel is None:
        raise LookupError(f"no kernel {name} in jit_kernels")
    if signature == PART_SIGNATURE:
        if not hasattr(kernel, "part_function"):
            raise TypeError(f"{name} is not a compiled part")
        kernel()
        return kernel.callback.cache_hits > 0
    if hasattr(kernel, "part_function"):
        raise TypeError(f"{name} is a compiled part: its signature is {PART_SIGNATURE!r}")
    argument_types = parse_signature(signature)
    # "loaded": no compile now (from the disk cache, or compiled inside an earlier entry)
    misses = sum(kernel.stats.cache_misses.values())
    kernel.compile(argument_types)
    return sum(kernel.stats.cache_misses.values()) == misses


class _CompileTimes(event.Listener):
    """A numba:compile listener appending {kernel, signature, self_s,
    inclusive_s, depth} to ``compiles`` for each compile of a kernel of this
    package that ends.  A compile of Numba's own functions (the overloads a
    kernel's code instantiates: string formatting for an error message, a
    builtin) counts in the self time of the kernel whose compile needed it."""

    def __init__(self):
        self.compiles = []
        self.open = []  # [start time, seconds of the kernel compiles nested in it, ours]

    def on_start(self, event):
        function = event.data["dispatcher"].py_func
        ours = function.__module__.startswith(f"{__package__}.")
        self.open.append([time.perf_counter(), 0.0, ours])

    def on_end(self, event):
        start, nested, ours = self.open.pop()
        inclusive = time.perf_counter() - start
        if not ours:
            return
        kernel_depth = sum(1 for frame in self.open if frame[2])
        for frame in reversed(self.open):  # the kernel this one is nested in
            if frame[2]:
                frame[1] += inclusive
                break
        try:
            signature = signature_text(event.data["args"])
        except TypeError:  # a type outside the manifest's grammar: shown as Numba does
            signature = "(" + ", ".join(str(t) for t in event.data["args"]) + ")"
        self.compiles.append({"kernel": _kernel_name(event.data["dispatcher"].py_func),
                              "signature": signature, "self_s": inclusive - nested,
                              "inclusive_s": inclusive, "depth": kernel_depth})


# -- warm-up -------------------------------------------------------------------

def cache_environment():
    """The environment the warm-up's processes compile in: this process's own."""
    return dict(os.environ)


def warmup_root():
    """Where the warm-up saves: the package's own seed (compiling.seed_dir), read
    by every process with no setting, where the install can be written; else
    None, the writable cache of compiling.usable_folder (the user's)."""
    from .compiling import saving_to, seed_dir
    try:
        with saving_to(seed_dir()):
            return seed_dir()
    except OSError:
        return None


def available_cpus():
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def shares(entries, count):
    """``entries`` split into at most ``count`` lists, each kernel's signatures
    in one (its helpers then compile once), kernels dealt out largest first to
    the list with the fewest signatures."""
    by_kernel = {}
    for name, signature in entries:
        by_kernel.setdefault(name, []).append((name, signature))
    lists = [[] for _ in range(max(1, min(count, len(by_kernel))))]
    for group in sorted(by_kernel.values(), key=len, reverse=True):
        min(lists, key=len).extend(group)
    return [share for share in lists if share]


def warmup(jobs=None, kernels=None, entries=None, print_progress=print, into="package"):
    """Compile every manifest signature (or ``entries``, or those of the kernel
    names in ``kernels``) into the disk cache, in ``jobs`` processes (default:
    the CPUs), and return the rows of :func:`compile_entries`.  ``into``: the
    cache root saved to ("package": :func:`warmup_root`; None: the writable
    cache of every process).  Signatures
    already cached are only loaded, so a second warm-up takes seconds.  Raises
    RuntimeError naming the signatures that failed, after compiling the rest."""
    if entries is None:
        entries = read_manifest()
    if kernels is not None:
        wanted = set(kernels)
        entries = [e for e in entries if e[0] in wanted]
    jobs = available_cpus() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"warmup: jobs={jobs}, expected 1 or more")
    start = time.perf_counter()
    root = warmup_root() if into == "package" else into
    if print_progress is not None:
        print_progress(f"warm-up: saving to {root or 'the kernel cache'}")
    rows = run_in_processes(shares(entries, jobs), cache_environment(), print_progress, root)
    entry_rows = [r for r in rows if r["entry"]]
    failed = [r for r in entry_rows if r["error"]]
    loaded = sum(r["loaded"] for r in entry_rows)
    if print_progress is not None:
        print_progress(f"warm-up: {len(entry_rows)} signatures of {len({r['kernel'] for r in entry_rows})} "
                       f"kernels, {len(entry_rows) - loaded - len(failed)} compiled, {loaded} loaded "
                       f"(from the cache, or compiled inside another), {len(failed)} failed, "
                       f"in {time.perf_counter() - start:.1f} s "
                       f"({len(shares(entries, jobs))} processes)")
    if failed:
        raise RuntimeError("warmup: these signatures failed to compile:\n" + "\n".join(
            f"  {r['kernel']} {r['signature']}: {r['error']}" for r in failed))
    return rows


def run_in_processes(share_lists, environment, print_progress=print, root=None):
    """Run :func:`compile_entries` on each list of entries in a process of its
    own, all at once, with ``environment``, saving under the cache root ``root``
    where given (compiling.saving_to); print each entry's line as it ends;
    return every process's rows."""
    total = sum(len(share) for share in share_lists)
    lock = threading.Lock()
    done, rows, failures = [0], [], []

    def follow(share):
        process = subprocess.Popen([sys.executable, "-m", __name__], env=environment,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        process.stdin.write(json.dumps({"root": root, "entries": share}))
        process.stdin.close()
        for line in process.stdout:
            kind, _, payload = line.partition(" ")
            with lock:
                if kind == "entry":
                    done[0] += 1
                    if print_progress is not None:
                        print_progress(_progress_line(json.loads(payload), done[0], total))
                elif kind == "rows":
                    rows.extend(json.loads(payload))
        if process.wait() != 0:
            failures.append(process.returncode)

    threads = [threading.Thread(target=follow, args=(share,)) for share in share_lists]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"warmup: compiling processes exited with {failures}")
    return rows


def _progress_line(row, done, total):
    state = ("FAILED: " + row["error"] if row["error"]
             else "loaded" if row["loaded"] else f"compiled in {row['inclusive_s']:.2f} s")
    return f"[{done}/{total}] {row['kernel']} {row['signature']}: {state}"


def _serve():
    """The compiling process of :func:`run_in_processes`: entries as JSON on
    stdin; prints ``entry <json>`` per entry, then ``rows <json>``."""
    from .compiling import saving_to
    request = json.load(sys.stdin)
    entries = [tuple(e) for e in request["entries"]]
    with saving_to(request["root"]) if request["root"] else contextlib.nullcontext():
        rows = compile_entries(entries, report=lambda row: print("entry", json.dumps(row), flush=True))
    print("rows", json.dumps(rows), flush=True)


if __name__ == "__main__":
    _serve()
