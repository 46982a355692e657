"""The runtime of a compiled function (K.function): input checks, the choice
between the Python plan and the whole compiled call, the plans per value of
the learning phase, and the updates written after a call."""
import functools
import os
import pickle
import sys
import threading

import numpy as np

from jit_kernels import tuning

from . import native, tiers
from .compiled_plan import argument_types, compile_call
from .graph import (
    Constant,
    Placeholder,
    Tensor,
    Update,
    Variable,
    format_shape,
    substitute,
    toposort,
)
from .ops import apply, as_tensor
from .ops.scan import Body
from .plan import Plan
from .rewrite import rewrite


def debug_level():
    try:
        return int(os.environ.get("NUMBACKEND_DEBUG", "0") or 0)
    except ValueError:
        return 0


class Function:
    """A compiled ``K.function``: call it with a list of arrays, one per input.

    Where Keras's learning phase is an input, each value fed has a plan of its
    own, built on its first call, with the phase a constant: K.in_train_phase
    takes its branch there and the other is never computed (a predict function
    fed 0 draws no dropout mask).  ``plan`` and :meth:`explain` show the plan of
    the value last fed."""

    def __init__(self, inputs, outputs, updates=(), name=None, input_numbers=None):
        """``input_numbers``: the number that messages give each input, where it
        is not its position (sparse.SparseFunction's inputs, a sparse input's
        three parts in its place)."""
        self.inputs = list(inputs)
        self._input_numbers = list(input_numbers or range(len(self.inputs)))
        for i, x in enumerate(self.inputs):
            if not isinstance(x, Placeholder):
                raise TypeError(f"function: input {self._input_numbers[i]} must be a placeholder, "
                                f"got {x!r}")
        # per input: its dtype, rank and known (axis, size) pairs, checked on every call
        self._expected = [(np.dtype(x.dtype), len(x.shape),
                           tuple((a, d) for a, d in enumerate(x.shape) if d is not None))
                          for x in self.inputs]
        self.single_output = not isinstance(outputs, (list, tuple))
        self.outputs = [as_tensor(o, where="function") for o in
                        ([outputs] if self.single_output else list(outputs))]
        self.update_vars = []
        update_values = []
        for u in updates or ():
            var, value = _unpack_update(u)
            value = as_tensor(value, dtype=var.dtype, where="function")
            if value.shape != var.shape and None not in value.shape:
                raise ValueError(f"function: update of variable {var.name!r} of shape "
                                 f"{format_shape(var.shape)} with a value of shape "
                                 f"{format_shape(value.shape)}")
            if value.dtype != var.dtype:
                value = apply("cast", value, dtype=var.dtype)
            self.update_vars.append(var)
            update_values.append(value)
        # what defines the function, before updates are lifted: what it pickles
        self._definition = (list(self.outputs), list(zip(self.update_vars, update_values)))
        self.outputs, update_values = lift_updates(self.outputs, self.update_vars, update_values)
        placeholders = list(self.inputs)
        self._defaults = []
        for node in toposort(self.outputs + update_values):
            if isinstance(node, Placeholder) and all(node is not p for p in placeholders):
                if node.default is None:
                    raise ValueError(f"function: the outputs depend on placeholder {node.name!r}, "
                                     "which is not among the inputs")
                placeholders.append(node)
                self._defaults.append(node.default)
        targets = self.outputs + update_values
        # A placeholder with a plan per value (Keras's learning phase): fed, its
        # value picks the plan, built on first use; else it is always its default.
        self._per_value = None  # its position among the arrays of a call
        for i, p in enumerate(placeholders):
            if p.plan_per_value and i >= len(self.inputs):
                targets = substitute(targets, {p.id: Constant(p.default, dtype=p.dtype)})
                del placeholders[i], self._defaults[i - len(self.inputs)]
                break
            if p.plan_per_value:
                self._per_value = i
                break
        self._placeholders, self._targets = placeholders, targets
        self._runners = {}  # the value fed: its runner, where a placeholder has a plan per value
        # held from reading the variables to writing their new values, so that
        # calls from several threads lose no update (see core.function)
        self._update_lock = threading.Lock() if self.update_vars else None
        self.name = name
        # A native entry built for this function and these values by an earlier
        # process serves the small calls (native.py); the plan is then built by
        # the first call it does not serve.
        self._native = None if self.update_vars else native.lookup(
            self, len(self.inputs), self._per_value)
        self._native_wanted = (not self.update_vars and self._native is None
                               and native.enabled())  # built once the whole call is due
        if self._native is not None:
            self._native_calls = 0
            self._leaving_native = tiers.Later("the plan after the native entry", "function: "
                                               "the plan did not load, so the native entry "
                                               "serves on")
        self._runner_lock = threading.Lock()
        self._runner = None
        if self._per_value is None and self._native is None:
            self._runner = self._new_runner(targets)

    def __reduce__(self):
        """A function pickles what defines it: its inputs, outputs, updates and name,
        with the graph they read and its variables' values as of pickling.
        Unpickled, it is built again from that graph, and its kernels come from the
        kernel cache (or compile) in that process: no compiled code is pickled.
        Its variables are copies: updates it writes there reach no other
        process's variables, nor theirs it.  Raises TypeError, naming the node,
        where the graph holds something that cannot be pickled."""
        outputs, updates = self._definition
        return pickled(type(self), (self.inputs, outputs[0] if self.single_output else outputs,
                                    updates, self.name, self._input_numbers), "function (pickled)")

    def _new_runner(self, targets, placeholders=None):
        runner = _PlanRunner(Plan(self._placeholders if placeholders is None else placeholders,
                                  targets, frozenset(v.id for v in self.update_vars)))
        level = debug_level()
        if level >= 1:
            print(runner.explain())
        if level >= 2:
            print(runner.plan.source)
            for k in runner.plan.kernels:
                print(k.SOURCE)
        return runner

    def _runner_for(self, value):
        """The runner of the plan where the placeholder with a plan per value is
        ``value``, a constant there (K.in_train_phase then takes its branch alone)."""
        runner = self._runners.get(value)
        if runner is None:
            placeholders, targets = self._graph_for(value)
            runner = self._runners[value] = self._new_runner(targets, placeholders)
        return runner

    def _graph_for(self, value):
        """``(placeholders, targets)`` where the placeholder with a plan per value
        is the constant ``value`` (that placeholder left out)."""
        fixed = self._placeholders[self._per_value]
        targets = substitute(self._targets, {fixed.id: Constant(value, dtype=fixed.dtype)})
        return [p for p in self._placeholders if p is not fixed], targets

    def _plan_runner(self):
        """The runner of the plan, built on first use where a native entry served
        the calls before (where no placeholder has a plan per value)."""
        with self._runner_lock:
            if self._runner is None:
                self._runner = self._new_runner(self._targets)
            return self._runner

    def _current(self):
        """The runner of the last call (before any call, that of the default value)."""
        if self._runner is None and self._per_value is None:
            return self._plan_runner()
        if self._runner is None:
            default = self._placeholders[self._per_value].default
            self._runner = self._runner_for(0 if default is None else int(default))
        return self._runner

    @property
    def plan(self):
        """The plan of the last call (see :meth:`_current`)."""
        return self._current().plan

    @property
    def whole_call(self):
        """The last call's plan compiled as one call (compiled_plan.Call, its
        ``source`` the generated code): None until it is compiled (see
        tuning.ONE_CALL_AFTER), False where the plan has no compiled form."""
        return self._current().one_call

    def _check(self, values):
        # Loops rather than generator expressions: at batch 1 a generator's
        # set-up is a noticeable part of a small network's whole call.
        if not isinstance(values, (list, tuple)):
            raise TypeError("function: call with a list of input arrays, "
                            f"got {type(values).__name__}")
        if len(values) != len(self.inputs):
            raise ValueError(f"function: expected {len(self.inputs)} input(s), got {len(values)}")
        arrays = []
        for i, value in enumerate(values):
            dtype, ndim, known = self._expected[i]
            if type(value) is np.ndarray:
                arr = value
            elif type(value) is float or type(value) is int:
                # Keras feeds the learning phase as 0. or 1.: made an array of the
                # input's dtype at once, not through float64 and the general check
                arr = _number_as(value, dtype)
            else:
                arr = np.asarray(value)
            if arr.dtype != dtype and not _castable(arr, dtype):
                _refuse_sparse(self._input_numbers[i], self.inputs[i], value)
                raise TypeError(f"function: input {self._input_numbers[i]} "
                                f"({self.inputs[i].name!r}) has dtype "
                                f"{dtype}; cannot cast a {arr.dtype} array to it")
            shape = arr.shape
            fits = len(shape) == ndim
            for axis, size in known:
                fits = fits and shape[axis] == size
            if not fits:
                raise ValueError(f"function: input {self._input_numbers[i]} "
                                 f"({self.inputs[i].name!r}) expects shape "
                                 f"{format_shape(self.inputs[i].shape)}, got {shape}")
            if arr.dtype != dtype or not arr.flags.c_contiguous:
                arr = np.array(arr, dtype=dtype, order="C")
            arrays.append(arr)
        return arrays

    def __call__(self, values=()):
        arrays = self._check(values)
        # A fork waits for calls under way: OpenBLAS's pool does not survive one
        # made while a product runs on it (see jit_kernels.fork).
        gate = _fork_gate()
        gate.enter()
        try:
            return self._serve(arrays)
        finally:
            gate.leave()

    def _serve(self, arrays):
        """The outputs for checked inputs, updates written where there are any."""
        if self._defaults:
            arrays += self._defaults
        if self._update_lock is not None:
            with self._update_lock:  # see core.function: one call with updates at a time
                return self._run_and_update(arrays)
        results = self._run(arrays)
        return results[0] if self.single_output else list(results)

    def _run(self, arrays):
        """The targets' values: from the native entry where it serves the call,
        else from the plan of the value fed where a placeholder has a plan per
        value, else from the plan."""
        entry = self._native
        if entry is not None and not tiers.warming():
            results = entry.run(arrays)
            if results is not None:
                self._native_calls += 1
                if self._native_calls >= tuning.ONE_CALL_AFTER:
                    self._leave_native_when_ready(arrays)
                return results
            if not entry.current:
                self._native = None  # a variable was assigned: the plan from now on
        return self._run_plan(arrays)

    def _leave_native_when_ready(self, arrays):
        """Leave the native entry once the plan and its whole call are ready,
        loaded (or compiled) in the background on inputs of zeros shaped like
        ``arrays``: the entry runs a batch in chunks on one thread each, where
        the plan's products split between the threads."""
        def work():
            zeros = [np.zeros_like(a) for a in arrays]

            def run():
                with tiers.warming_up():
                    self._run_plan(zeros)
            return run

        if self._leaving_native.ready(work):
            self._native = None

    def _run_plan(self, arrays):
        """The targets' values from the plan (of the value fed, where a
        placeholder has a plan per value)."""
        if self._per_value is None:
            runner = self._runner or self._plan_runner()
        else:
            value = int(arrays.pop(self._per_value))
            runner = self._runner = self._runner_for(value)
        results = runner.run(arrays)
        if (self._native_wanted and runner.small_calls >= tuning.ONE_CALL_AFTER
                and runner.one_call is not False
                and (self._per_value is None or runner is self._runners.get(0))):
            self._native_wanted = False  # its whole call is due: worth an entry
            native.build_later(self)
        return results

    def _run_and_update(self, arrays):
        """The outputs, after writing the updates' new values (all computed from the
        values before the call, none written where one has the wrong shape)."""
        results = self._run(arrays)
        native.trained()
        n = len(self.outputs)
        new_values = results[n:]
        for var, value in zip(self.update_vars, new_values):
            if value.shape != var.shape:
                raise ValueError(f"function: update of variable {var.name!r} of shape "
                                 f"{var.shape} computed a value of shape {value.shape}; "
                                 "no variable was changed")
        for var, value in zip(self.update_vars, new_values):
            var.value = value
        if self._runner.one_call:
            self._runner.one_call.forget()  # the values it read are replaced: hold them no longer
        outputs = results[:n]
        written = {id(value) for value in new_values}
        if any(id(out) in written for out in outputs):
            # an output that is an update's new value (K.update's result among the
            # outputs) is the caller's copy: writing into it must not change the variable
            outputs = [out.copy() if id(out) in written else out for out in outputs]
        return outputs[0] if self.single_output else list(outputs)

    def warmup(self, batch_sizes=(1,)):
        """Compile now every tier this function runs for inputs of these batch
        sizes (axis 0), and wait for them: the plan's kernels, the whole call
        (where the inputs are small, see tuning.ONE_CALL_MAX_ELEMENTS) and the
        loops of its scans; for a function without updates, also its native
        entry (native.py), which the processes after it start from, where it
        has none.  A server calls it before it serves, and its calls
        then compile nothing.  The function runs once per size on inputs of
        zeros (where a placeholder has a plan per value, Keras's learning
        phase, its value is 0: the predict plan); updates are computed, not
        written.  Raises ValueError where an input has an axis of unknown size
        other than axis 0."""
        for batch in batch_sizes:
            if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
                raise ValueError(f"function.warmup: a batch size must be a positive int, "
                                 f"got {batch!r}")
            arrays = []
            for i, x in enumerate(self.inputs):
                if any(d is None for d in x.shape[1:]):
                    raise ValueError(f"function.warmup: input {self._input_numbers[i]} "
                                     f"({x.name!r}) has shape {format_shape(x.shape)}: only "
                                     "axis 0 (the batch) may be of unknown size; call the "
                                     "function on an example instead")
                shape = tuple(batch if d is None else d for d in x.shape)
                arrays.append(np.zeros(shape, x.dtype))
            arrays += self._defaults
            gate = _fork_gate()
            gate.enter()
            try:
                with tiers.warming_up():
                    self._run(arrays)
            finally:
                gate.leave()
        if self._native_wanted:
            self._native_wanted = False
            native.build_now(self)

    def inference_program(self):
        """``(program, inputs, defaults)`` for an export (numbackend/exporting.py):
        the program of the plan that predicts (where a placeholder has a plan per
        value, Keras's learning phase, the plan of 0), the function's inputs that
        are its first placeholders, in order, and the values of its other
        placeholders (those not among the inputs, which have a default)."""
        if self._per_value is None:
            return self._current().plan.program, list(self.inputs), list(self._defaults)
        inputs = [x for i, x in enumerate(self.inputs) if i != self._per_value]
        return self._runner_for(0).plan.program, inputs, list(self._defaults)

    def inference_graph(self):
        """``(nodes, placeholders, targets)`` of the plan that predicts, its
        targets rewritten as a plan's graph is (rewrite.rewrite: where a
        placeholder has a plan per value, Keras's learning phase, it is 0 and a
        switch on it is its branch), ``nodes`` its nodes in the order they
        pickle (:func:`graph_nodes`): what a native entry is keyed by
        (native.py).  Raises TypeError where a node cannot be pickled."""
        placeholders, targets = (self._graph_for(0) if self._per_value is not None
                                 else (list(self._placeholders), list(self._targets)))
        targets = rewrite(targets)
        return graph_nodes([placeholders, targets], "native key"), placeholders, targets

    def inference_run(self, arrays):
        """The values of :meth:`inference_program`'s targets for ``arrays`` (one
        per input it gives, of its dtype, C-contiguous), its defaults added:
        what an export's library must predict.  Updates are not written."""
        arrays = list(arrays) + list(self._defaults)
        runner = self._current() if self._per_value is None else self._runner_for(0)
        return list(runner.run(arrays))

    def explain(self):
        """The compiled plan, one line per step (where a placeholder has a plan per
        value, the plan of the value last fed: before any call, of its default)."""
        text = self._current().explain()
        if self._native is not None:
            text += f"\n     (small calls served by the native entry {self._native.path})"
        return text

    def kernel_sources(self):
        """The generated source of each kernel the plan calls."""
        return [k.SOURCE for k in self.plan.kernels]


class _PlanRunner:
    """A plan and, once called tuning.ONE_CALL_AFTER times with small inputs, the plan
    compiled as one call: ``run(arrays)`` gives the targets' values."""

    def __init__(self, plan):
        self.plan = plan
        self.small_calls = 0
        self.one_call = None  # compiled_plan.Call once compiled; False where it cannot be
        self._compiling = tiers.Later("the whole call", "function: the plan did not compile as "
                                      "one call, so it runs from Python")

    def run(self, arrays):
        """The targets' values: from the plan compiled as one call where it serves,
        else from the plan."""
        one_call = self.one_call
        if one_call is not False:
            size = 0
            for a in arrays:
                size += a.size
            if size <= tuning.ONE_CALL_MAX_ELEMENTS:
                results = one_call.run(*arrays) if one_call else self._count_small_call(arrays)
                if results is not None:
                    return results
        return self.plan.run(*arrays)

    def _count_small_call(self, arrays):
        """The results from the plan compiled as one call once called with small
        inputs tuning.ONE_CALL_AFTER times and compiled (in the background unless
        tuning.TIER_COMPILE says otherwise: the plan serves meanwhile); None where
        the plan runs instead."""
        self.small_calls += 1
        if self.small_calls < tuning.ONE_CALL_AFTER and not tiers.warming():
            return None
        if not self._compiling.ready(lambda: functools.partial(
                _compile_whole_call, self.plan.program, argument_types(arrays))):
            if self._compiling.failure is not None:
                self.one_call = False
            return None
        self.one_call = self._compiling.result or False
        return self.one_call.run(*arrays) if self.one_call else None

    def explain(self):
        """The plan, one line per step."""
        text = self.plan.explain()
        if self.one_call:
            text += (f"\n     (inputs of at most {tuning.ONE_CALL_MAX_ELEMENTS} elements: "
                     "these steps run as one compiled call)")
        elif self._compiling.compiling:
            text += "\n     (these steps compiling as one call, in the background)"
        elif self._compiling.failure is not None:
            text += f"\n     (these steps did not compile as one call: {self._compiling.failure})"
        return text


def _compile_whole_call(program, types):
    """The program as a compiled_plan.Call compiled for placeholder arrays of
    ``types``, or None where it has no compiled form."""
    call = compile_call(program)
    if call:
        call.compile(types)
    return call


@functools.cache
def _fork_gate():
    # jit_kernels is loaded on a function's first call, not when numbackend is imported
    from jit_kernels import fork_gate
    return fork_gate


def _refuse_sparse(i, placeholder, value):
    """Raise where a scipy.sparse matrix is fed to dense input ``i``: as
    TensorFlow, numbackend does not make it dense (Keras does, before its calls)."""
    if is_scipy_sparse(value):
        raise TypeError(f"function: input {i} ({placeholder.name!r}) is dense, of shape "
                        f"{format_shape(placeholder.shape)}: got a scipy.sparse matrix of shape "
                        f"{value.shape}; feed value.toarray(), or make the input sparse "
                        "(K.placeholder(..., sparse=True), Input(..., sparse=True))")


def _number_as(value, dtype):
    """A Python int or float fed to an input of ``dtype``: a 0-d array of that dtype
    where it fits as it is (a whole float for an integer input), else the
    float64 or int64 array that :func:`_castable` judges."""
    if dtype.kind in "biu" and type(value) is float:
        if not value.is_integer():
            return np.asarray(value)  # which _castable refuses
        value = int(value)
    try:
        return np.array(value, dtype)
    except OverflowError:  # out of dtype's range
        return np.asarray(value)


def _castable(arr, dtype):
    """May an input array of another dtype than its placeholder's (``dtype``) be cast to it?"""
    return (np.can_cast(arr.dtype, dtype, "same_kind")
            or (arr.dtype.kind in "biu" and dtype.kind in "iuf")
            # Keras feeds e.g. the learning phase as 1.0: integral floats are fine
            or (arr.dtype.kind == "f" and dtype.kind in "biu"
                and np.array_equal(arr, np.trunc(arr))))


def lift_updates(outputs, update_vars, update_values):
    """The outputs and update values with each graph.Update they depend on read as
    its new value, and the updates of the call (``update_vars`` is extended in
    place) with those Updates' assignments added: evaluating an Update writes its
    variable once per call, as TensorFlow's assign ops do, even where it is also
    among the updates or read several times."""
    # an Update passed as an update is not added again
    given = {id(value) for var, value in zip(update_vars, update_values)
             if isinstance(value, Update) and value.variable is var}
    replacements = {}
    for node in toposort(outputs + update_values):
        if isinstance(node, Update):
            (new_value,) = substitute([node.new_value], replacements)  # inner Updates first
            replacements[node.id] = new_value
            if id(node) not in given:
                update_vars.append(node.variable)
                update_values.append(node)
    if not replacements:
        return outputs, update_values
    lifted = substitute(outputs + update_values, replacements)
    return lifted[:len(outputs)], lifted[len(outputs):]


def _unpack_update(u):
    if isinstance(u, Update):
        return u.variable, u
    if isinstance(u, (list, tuple)) and len(u) == 2:
        var, value = u
    else:
        raise TypeError(f"function: an update must be a (variable, new_value) pair, got {u!r}")
    if not isinstance(var, Variable):
        raise TypeError(f"function: updates must target variables, got {var!r}")
    return var, value


def is_scipy_sparse(value):
    """Whether ``value`` is a scipy.sparse matrix or array (without importing SciPy:
    such a value exists only where scipy.sparse is imported)."""
    scipy_sparse = sys.modules.get("scipy.sparse")
    return scipy_sparse is not None and scipy_sparse.issparse(value)


def pickled(cls, arguments, where):
    """What ``__reduce__`` returns for a compiled function: unpickled, it is
    ``cls(*arguments)``, built again from the graph that ``arguments`` hold.
    Raises TypeError, naming the node, where that graph holds a value that
    pickle cannot carry to another process (a lambda, a lock...)."""
    return _built_again, (graph_nodes(arguments, where), cls, arguments)


def _built_again(nodes, cls, arguments):
    # ``nodes`` is pickled before ``arguments`` only for its order (see graph_nodes)
    return cls(*arguments)


def graph_nodes(values, where):
    """Every node of the graph of the tensors in ``values`` (lists, tuples, update
    pairs), the graphs of scans' steps included, each after the nodes it reads.
    Pickled in this order, each node's inputs are pickled before it, and pickle
    does not recurse along a deep graph (a chain of a few hundred nodes would
    exceed Python's recursion limit).  Raises TypeError where a node holds a
    value that cannot be pickled."""
    order, seen = [], set()

    def visit(roots):
        for node in toposort(roots):
            if id(node) in seen:
                continue
            seen.add(id(node))
            holder = f"{where}: node {node.name!r} (op {node.op})"
            for key, value in vars(node).items():
                if key not in _NOT_PICKLED:
                    visit(_held_tensors(value, holder, key))
            order.append(node)

    visit(_held_tensors(list(values), where, "arguments"))
    return order


# a node's attributes that are not pickled (see graph.Tensor.__reduce_ex__) or
# hold only its inputs (toposort walks them)
_NOT_PICKLED = ("id", "inputs", "_keras_history")

# values that pickle as they are
_PLAIN = (np.ndarray, np.generic, np.dtype, str, bytes, int, float, complex, bool,
          type(None), slice, type(Ellipsis))


def _held_tensors(value, holder, key):
    """The tensors in ``value``, attribute ``key`` of ``holder`` (inside lists,
    tuples, dicts and a scan's step, ops.scan.Body); raises TypeError where
    another value in it cannot be pickled."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, Body):
        value = list(vars(value).values())
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _held_tensors(item, holder, key)]
    if not isinstance(value, _PLAIN):
        try:
            pickle.dumps(value)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise TypeError(f"{holder} holds {value!r} (in its {key!r}), which cannot be pickled "
                            f"({error}); a compiled function pickles only where its whole graph "
                            "does") from None
    return []
