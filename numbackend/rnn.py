"""Loops over a sequence: ``rnn`` (Keras's recurrent layers), ``foldl``,
``foldr`` and ``map_fn``, all on the scan op (ops/scan.py): the step is traced
once and the loop runs as one plan step."""
from .core import zeros_like
from .graph import Tensor, canonical_dtype, format_shape
from .ops import apply, as_tensor
from .ops.scan import scan


def _time_major(x):
    return apply("transpose", x, axes=(1, 0) + tuple(range(2, x.ndim)))


def _mask_for(m_t, target):
    """The per-step mask (batch,) shaped to broadcast against ``target``."""
    return apply("reshape", m_t, shape=(-1,) + (1,) * (target.ndim - 1))


def _zero_output(first_output, initial_states):
    """Zeros like the step's output.  Where the first state has the output's
    static shape and dtype (Keras's cells), zeros like that state: the plan then
    runs no step outside the loop for the output's shape alone.  Should the two
    still differ at run time, the scan's check of the carried state's shape
    fails on the first step."""
    if initial_states:
        state = initial_states[0]
        if state.shape == first_output.shape and state.dtype == first_output.dtype:
            return zeros_like(state)
    return zeros_like(first_output)


def rnn(step_function, inputs, initial_states, go_backwards=False, mask=None, constants=None,
        unroll=False, input_length=None):
    """Iterate ``step_function`` over the time axis (axis 1) of ``inputs``.

    ``step_function(input_t, states + constants)`` returns ``(output_t,
    new_states)``, with ``input_t`` of shape (batch, ...).  With ``mask`` (a
    (batch, time) boolean tensor), a masked step leaves the states unchanged
    and repeats the previous step's output (zeros before the first kept step),
    as in the TensorFlow backend.  ``go_backwards`` walks the time axis in
    reverse (the outputs come in that reversed order).  ``unroll`` and
    ``input_length`` are accepted for compatibility: the loop is always one
    compiled scan, with the same results as an unrolled one.

    Returns ``(last_output, outputs, new_states)``: the last step's output
    (batch, ...), all outputs (batch, time, ...) and the final states.
    """
    inputs = as_tensor(inputs, where="rnn")
    if inputs.ndim < 3:
        raise ValueError(f"rnn: inputs must have rank >= 3 (batch, time, ...), got shape "
                         f"{format_shape(inputs.shape)}")
    initial_states = [as_tensor(s, where="rnn") for s in initial_states]
    constants = [as_tensor(c, where="rnn") for c in (constants or ())]
    x = _time_major(inputs)
    sequences = [x]
    if mask is not None:
        mask = as_tensor(mask, where="rnn")
        if mask.ndim == 3 and mask.shape[2] == 1:
            mask = apply("getitem", mask, key=(slice(None), slice(None), 0))
        if mask.ndim != 2:
            raise ValueError(f"rnn: mask must have shape (batch, time), got "
                             f"{format_shape(mask.shape)} for inputs of shape "
                             f"{format_shape(inputs.shape)}")
        for a, b in zip(mask.shape, inputs.shape[:2]):
            if a is not None and b is not None and a != b:
                raise ValueError(f"rnn: mask of shape {format_shape(mask.shape)} does not match "
                                 f"inputs of shape {format_shape(inputs.shape)}")
        if mask.dtype != "bool":
            mask = apply("cast", mask, dtype="bool")
        sequences.append(_time_major(mask))
    if go_backwards:
        sequences = [apply("reverse", s, axes=(0,)) for s in sequences]

    # The first call, on the first step's tensors, is TensorFlow's too: Keras cells
    # create their dropout masks there, outside the loop, and reuse them in the loop.
    first_output, _ = step_function(apply("getitem", sequences[0], key=(0,)),
                                    tuple(initial_states) + tuple(constants))
    first_output = as_tensor(first_output, where="rnn")
    n_states = len(initial_states)
    states = list(initial_states)
    if mask is not None:
        # masked steps repeat the previous output, carried as an extra state that
        # starts at zeros: not the first state, even where that is the output
        # (Keras's cells), as a masked first step outputs zeros
        states.append(_zero_output(first_output, initial_states))
    uses_learning_phase = []

    def step(slices, carried):
        output, new_states = step_function(slices[0], tuple(carried[:n_states]) + tuple(constants))
        output = as_tensor(output, where="rnn")
        new_states = [as_tensor(s, where="rnn") for s in new_states]
        uses_learning_phase.append(getattr(output, "_uses_learning_phase", False))
        if mask is not None:
            m_t = slices[1]
            output = apply("where", _mask_for(m_t, output), output, carried[n_states])
            new_states = [apply("where", _mask_for(m_t, new), new, old)
                          for new, old in zip(new_states, carried[:n_states])]
            new_states.append(output)
        return [output], new_states

    (outputs,), history = scan(step, sequences, states, where="rnn")
    last_output = apply("getitem", outputs, key=(-1,))
    outputs = _time_major(outputs)
    new_states = [apply("getitem", h, key=(-1,)) for h in history[:n_states]]
    last_output._uses_learning_phase = any(uses_learning_phase)
    return last_output, outputs, new_states


def _fold(where, fn, elems, initializer, reverse):
    elems = as_tensor(elems, where=where)
    if elems.ndim == 0:
        raise ValueError(f"{where}: elems must have rank >= 1, got a scalar")
    if initializer is None:
        first = -1 if reverse else 0
        initializer = apply("getitem", elems, key=(first,))
        elems = apply("getitem", elems, key=(slice(None, -1) if reverse else slice(1, None),))
    initializer = as_tensor(initializer, where=where)

    def step(slices, states):
        return [], [as_tensor(fn(states[0], slices[0]), dtype=states[0].dtype, where=where)]

    _, (final,) = scan(step, [elems], [initializer], reverse=reverse, keep_history=False,
                       where=where)
    return final


def foldl(fn, elems, initializer=None, name=None):
    """Reduce ``elems`` along axis 0 from the first element: ``acc = fn(acc, x)``.

    Without ``initializer`` the first element starts the accumulator."""
    return _fold("foldl", fn, elems, initializer, reverse=False)


def foldr(fn, elems, initializer=None, name=None):
    """Reduce ``elems`` along axis 0 from the last element: ``acc = fn(acc, x)``.

    Without ``initializer`` the last element starts the accumulator."""
    return _fold("foldr", fn, elems, initializer, reverse=True)


def map_fn(fn, elems, name=None, dtype=None):
    """``fn`` applied to each element of ``elems`` along axis 0, the results stacked.

    ``dtype``, when given, is the dtype of the result."""
    elems = as_tensor(elems, where="map_fn")
    dtype = None if dtype is None else canonical_dtype(dtype, "map_fn")
    if elems.ndim == 0:
        raise ValueError("map_fn: elems must have rank >= 1, got a scalar")

    def step(slices, states):
        out = fn(slices[0])
        out = as_tensor(out, dtype=dtype if not isinstance(out, Tensor) else None, where="map_fn")
        if dtype is not None and out.dtype != dtype:
            out = apply("cast", out, dtype=dtype)
        return [out], []

    (stacked,), _ = scan(step, [elems], [], where="map_fn")
    return stacked


__all__ = ["foldl", "foldr", "map_fn", "rnn"]
