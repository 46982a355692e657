"""Compile time as a budget, and compiling the library before a model needs it.

- ``python -m numbackend compile-report``: compiles every signature of the
  library's manifest (jit_kernels/signatures.txt) in a fresh process with empty
  caches and lists each compile's time, the compiles nested in it left out
  (self) and counted (inclusive), flagging those over
  ``tuning.LIBRARY_COMPILE_BUDGET_S``.
- ``--models``: the time of each workload of asv_bench's compile_workloads.py
  (W1-W7, the Keras models) in a fresh process with an empty kernel cache, and
  how much of it compiled library kernels.
- ``--record``: runs those workloads and writes the library signatures they
  compiled or loaded as the manifest (``--add``: adds them to it).
- ``python -m numbackend warmup [--jobs N] [--report]`` (or :func:`warmup`):
  compiles every manifest signature into the disk cache, so that a model's
  first call compiles only its own kernels (``--report``: then the table).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from . import cpus, tuning

_SOURCE_TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warmup(jobs=None, kernels=None, print_progress=print):
    """Compile every signature of the library's manifest into the disk cache, in
    ``jobs`` processes (default: the CPUs this process may use), so that a model's first call
    compiles only its own kernels; ``kernels``: only those kernel names.  A
    second warm-up only loads (seconds).  Returns one dict a compile (see
    jit_kernels.manifest.compile_entries); raises RuntimeError naming the
    signatures that failed to compile."""
    from jit_kernels import manifest
    if jobs is None:
        jobs = cpus.available_cpus()  # a container's CPU quota too
    return manifest.warmup(jobs=jobs, kernels=kernels, print_progress=print_progress)


def empty_cache_environment(cold_library=True):
    """This process's environment with a new empty kernel cache and, with
    ``cold_library``, the package's seed left unread: a process started with it
    compiles everything (without: all but what the warm-up saved)."""
    environment = dict(os.environ)
    environment["NUMBACKEND_CACHE_DIR"] = tempfile.mkdtemp(prefix="numbackend-report-")
    environment.pop("NUMBACKEND_CACHE_SEED", None)
    if cold_library:
        environment["NUMBACKEND_PACKAGE_SEED"] = "0"
    return environment


def library_report(jobs=1, kernels=None, print_progress=None):
    """Compile the manifest's signatures (of ``kernels`` only, where given) in
    ``jobs`` fresh processes with empty caches; returns the rows of
    jit_kernels.manifest.compile_entries."""
    from jit_kernels import manifest
    entries = manifest.read_manifest()
    if kernels is not None:
        unknown = set(kernels) - {name for name, _ in entries}
        if unknown:
            raise ValueError(f"library_report: no manifest entries for {sorted(unknown)}")
        entries = [e for e in entries if e[0] in set(kernels)]
    return manifest.run_in_processes(manifest.shares(entries, jobs), empty_cache_environment(),
                                     print_progress)


def format_report(rows, budget_s=None):
    """The compile report's table: one line a compile, slowest (self time) first;
    compiles nested in a manifest entry are marked ``in``; a compile whose self
    time is over ``budget_s`` (default tuning.LIBRARY_COMPILE_BUDGET_S) is
    flagged ``OVER``."""
    budget_s = tuning.LIBRARY_COMPILE_BUDGET_S if budget_s is None else budget_s
    lines = [f"{'self s':>7} {'incl s':>7}  {'':4} kernel signature"]
    for row in sorted(rows, key=lambda r: -r["self_s"]):
        flag = "OVER" if row["self_s"] > budget_s else ""
        where = "" if row["entry"] else "in "
        error = f"  FAILED: {row['error']}" if row["error"] else ""
        lines.append(f"{row['self_s']:7.2f} {row['inclusive_s']:7.2f}  {flag:4} "
                     f"{where}{row['kernel']} {row['signature']}{error}")
    entries = [r for r in rows if r["entry"]]
    over = [r for r in rows if r["self_s"] > budget_s]
    lines.append(f"{len(entries)} manifest signatures, {len(rows) - len(entries)} nested compiles; "
                 f"self time in all {sum(r['self_s'] for r in rows):.1f} s; "
                 f"{len(over)} over the budget of {budget_s:g} s")
    return "\n".join(lines)


def _workloads_module():
    """asv_bench's compile_workloads, from the source tree (it is not installed)."""
    folder = os.path.join(_SOURCE_TREE, "asv_bench")
    if not os.path.isfile(os.path.join(folder, "benchmarks", "compile_workloads.py")):
        raise FileNotFoundError(f"compile-report: the workloads need the source tree's "
                                f"asv_bench folder, not found at {folder}")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    from benchmarks import compile_workloads
    return compile_workloads


def workload_names():
    """The names of the workloads of asv_bench's compile_workloads.py."""
    return list(_workloads_module().WORKLOADS)


def run_workload(name):
    """Run workload ``name`` in this process; returns {workload, seconds, library
    compile seconds (self time of jit_kernels compiles), library compiles, the
    library signatures compiled or loaded: [(kernel, signature)]}."""
    from numba.core import event

    from jit_kernels import manifest
    workloads = _workloads_module()
    library = {"seconds": 0.0, "count": 0}

    class LibraryCompiles(event.Listener):
        def __init__(self):
            self.open = []

        def on_start(self, event):
            self.open.append([time.perf_counter(), 0.0])

        def on_end(self, event):
            start, nested = self.open.pop()
            spent = time.perf_counter() - start
            if self.open:
                self.open[-1][1] += spent
            if event.data["dispatcher"].py_func.__module__.startswith("jit_kernels."):
                library["seconds"] += spent - nested
                library["count"] += 1

    start = time.perf_counter()
    # every tier compiles in the call that makes it due, so that all are recorded and
    # timed; no native entry's build, a process of its own beside them
    with event.install_listener("numba:compile", LibraryCompiles()), \
            tuning.override(TIER_COMPILE="in_call", SCAN_LOOP_AFTER=1, NATIVE_TIER="off"):
        workloads.run(name)
    seconds = time.perf_counter() - start
    signatures = [(kernel_name, signature)
                  for kernel_name, kernel in manifest.kernels().items()
                  for signature in manifest.compiled_signatures(kernel)]
    return {"workload": name, "seconds": seconds, "library_compile_s": library["seconds"],
            "library_compiles": library["count"], "signatures": signatures}


def run_workloads(names, environment, jobs=1, print_progress=print):
    """Run each workload of ``names`` in a fresh process with ``environment``,
    ``jobs`` at a time; returns their :func:`run_workload` results (for a
    workload that failed, {workload, failed: its exit status})."""
    import concurrent.futures

    def one(name):
        command = [sys.executable, "-m", "numbackend", "compile-report", "--run-workload", name]
        done = subprocess.run(command, check=False, env=environment, stdout=subprocess.PIPE,
                              text=True)
        if done.returncode != 0:
            if print_progress is not None:
                print_progress(f"{name}: FAILED (exit {done.returncode})")
            return {"workload": name, "failed": done.returncode}
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if print_progress is not None:
            print_progress(f"{name}: {result['seconds']:.1f} s, of which compiling "
                           f"{result['library_compiles']} library kernels "
                           f"{result['library_compile_s']:.1f} s")
        return result

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one, names))


def record(names=None, jobs=1, add=False, print_progress=print):
    """Run the workloads (all, or ``names``), each in a fresh process, and write
    the library signatures they compiled or loaded as the manifest (``add``:
    added to the manifest's entries); returns the entries written."""
    from jit_kernels import manifest
    results = run_workloads(names or workload_names(), dict(os.environ), jobs, print_progress)
    failed = [result["workload"] for result in results if "failed" in result]
    if failed:
        raise RuntimeError(f"record: workloads {failed} failed; the manifest is left as it was")
    entries = {tuple(s) for result in results for s in result["signatures"]}
    if add:
        entries |= set(manifest.read_manifest())
    entries = sorted(entries)
    manifest.write_manifest(entries)
    if print_progress is not None:
        print_progress(f"wrote {len(entries)} signatures of {len({e[0] for e in entries})} "
                       f"kernels to {manifest.MANIFEST_PATH}")
    return entries


_USAGE = """usage:
  python -m numbackend compile-report [--jobs N] [--kernel NAME ...]
      compile the library's manifest in fresh processes with empty caches; list each compile
  python -m numbackend compile-report --models [--jobs N] [--cold-library] [WORKLOAD ...]
      time each workload in a fresh process with an empty kernel cache (--cold-library:
      the package's seed left unread too, so that library kernels compile as well)
  python -m numbackend compile-report --record [--add] [--jobs N] [WORKLOAD ...]
      run the workloads and write the library signatures they use as the manifest
      (--add: add them to the manifest's)
  python -m numbackend warmup [--jobs N] [--report]
      compile every manifest signature into the disk cache (--report: then list each compile)"""


def _options(argv):
    """(flags, jobs or None, other words) of a command line."""
    flags, words, jobs = set(), [], None
    items = iter(argv)
    for item in items:
        if item == "--jobs":
            try:
                jobs = int(next(items))
            except (StopIteration, ValueError):
                raise ValueError("--jobs takes a number") from None
        elif item.startswith("--"):
            flags.add(item)
        else:
            words.append(item)
    return flags, jobs, words


def main(command, argv):
    """``python -m numbackend compile-report|warmup ...``; returns the exit status."""
    try:
        flags, jobs, words = _options(argv)
    except ValueError as error:
        print(f"{error}\n{_USAGE}", file=sys.stderr)
        return 2
    known = {"warmup": {"--report"}, "compile-report": {"--models", "--record", "--cold-library",
                                                 "--kernel", "--run-workload", "--add"}}[command]
    if flags - known:
        print(f"unknown options {sorted(flags - known)}\n{_USAGE}", file=sys.stderr)
        return 2
    if command == "warmup":
        try:
            rows = warmup(jobs=jobs)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        if "--report" in flags:
            print(format_report(rows))
        return 0
    if "--run-workload" in flags:
        print(json.dumps(run_workload(words[0])))
        return 0
    if "--record" in flags:
        try:
            record(words or None, jobs or 1, add="--add" in flags)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        return 0
    if "--models" in flags:
        environment = empty_cache_environment(cold_library="--cold-library" in flags)
        run_workloads(words or workload_names(), environment, jobs or 1)
        return 0
    start = time.perf_counter()
    rows = library_report(jobs or 1, words if "--kernel" in flags else None,
                          print_progress=print)
    print(format_report(rows))
    print(f"{time.perf_counter() - start:.1f} s in {jobs or 1} processes")
    return 0 if not any(r["error"] for r in rows) else 1
