"""The scan op: a step sub-graph run once per element of axis 0 of its sequences.

``scan(step, sequences, initial_states)`` traces ``step`` once on placeholders
(one step's slices of the sequences and the carried states) and splits what it
recorded three ways:

- loop invariants (depend on neither): computed once, outside the loop, and fed
  to every step (weights, biases, dropout masks, constants);
- work on the sequences alone that is the same op for every step (element-wise
  ops and slices, and products with an invariant matrix where the loop does not
  run them better, see :func:`_product_stays_in_loop`): hoisted out of the loop
  and run once over all steps;
- the rest, the body: built once into a program (fused kernels, BLAS calls)
  that the scan's lowering (lowering.Scan) runs per step: the first step as a
  plan, the others in one compiled loop where the body has one (scan_loop.py).

A scan node's value is a tuple: each per-step output stacked along a new axis 0,
then each state, stacked per step too (its history) or only its final value.
Its gradient is another scan, run in the opposite direction, whose body is the
vector-Jacobian product of the step (back-propagation through time); it
recomputes each step's forward values from the stored state history.
"""
import numpy as np

from ..graph import Constant, Placeholder, consumers_of, format_shape, substitute, toposort
from . import batch
from .linalg import is_float_matrix_product, merge_sibling_dots
from .registry import OPS, apply, as_tensor, is_float, library


class Body:
    """A traced step: its placeholders (sequence slices, states, invariants) and
    its targets (per-step outputs, then new states).  Its program and loop are
    built where a function runs the scan (lowering.Scan, plan.Bodies)."""

    def __init__(self, where, seq_inputs, state_inputs, invariant_inputs, outputs, new_states):
        self.where = where
        self.seq_inputs = seq_inputs
        self.state_inputs = state_inputs
        self.invariant_inputs = invariant_inputs
        self.outputs = outputs
        self.new_states = new_states

    def __repr__(self):
        return f"<Body {self.where} {id(self):x}>"


def _scan_infer(inputs, attrs):
    body = attrs["body"]
    n_seq, n_state = len(body.seq_inputs), len(body.state_inputs)
    lengths = {s.shape[0] for s in inputs[:n_seq]} - {None}
    if len(lengths) > 1:
        raise ValueError(f"{body.where}: the sequences differ in length along axis 0: "
                         + ", ".join(format_shape(s.shape) for s in inputs[:n_seq]))
    attrs["length"] = lengths.pop() if lengths else None
    for j, (init, ph) in enumerate(zip(inputs[n_seq:n_seq + n_state], body.state_inputs)):
        if init.dtype != ph.dtype:
            raise TypeError(f"{body.where}: initial state {j} has dtype {init.dtype}, "
                            f"the step expects {ph.dtype}")
    return (), (body.outputs + body.new_states)[0].dtype


def _item(node, index):
    """Output ``index`` of a scan node as a tensor."""
    body = node.attrs["body"]
    targets = body.outputs + body.new_states
    t = targets[index]
    stacked = index < len(body.outputs) or node.attrs["keep_history"]
    shape = ((node.attrs["length"],) + t.shape) if stacked else body.state_inputs[
        index - len(body.outputs)].shape
    return apply("tuple_item", node, index=index, shape=shape, dtype=t.dtype)


def zeros_like(x):
    """Zeros of a tensor's run-time shape (broadcast: an inf in x stays out)."""
    return apply("broadcast_like", Constant(np.zeros((), x.dtype)), x)


def _shift(history, init, reverse):
    """Each step's previous state: the history moved one step, the initial state first."""
    first = apply("reshape_like", init, apply("getitem", history, key=(slice(0, 1),)))
    if reverse:
        return apply("concatenate", apply("getitem", history, key=(slice(1, None),)), first, axis=0)
    return apply("concatenate", first, apply("getitem", history, key=(slice(None, -1),)), axis=0)


def _total(products):
    """The sum of all elements of each product, added up: the scalar whose gradient
    is a vector-Jacobian product."""
    total = None
    for a, b in products:
        term = apply("sum", apply("multiply", a, b), axis=tuple(range(a.ndim)))
        total = term if total is None else apply("add", total, term)
    return total


def _scan_grad(grads, node, wanted, gradients):
    """Back-propagation through time: a reverse scan over the step's VJP.  The
    gradients of the sequences that are not ``wanted`` are left out: an RNN's
    input placeholder would cost a product per step (its step's products by the
    kernel run in the loop, see :func:`_product_stays_in_loop`)."""
    body = node.attrs["body"]
    reverse, keep = node.attrs["reverse"], node.attrs["keep_history"]
    n_seq, n_state = len(body.seq_inputs), len(body.state_inputs)
    n_out = len(body.outputs)
    seqs = list(node.inputs[:n_seq])
    inits = list(node.inputs[n_seq:n_seq + n_state])
    invariants = list(node.inputs[n_seq + n_state:])
    history_node = node if keep else apply("scan", *node.inputs, body=body, reverse=reverse,
                                           keep_history=True)
    previous = [_shift(_item(history_node, n_out + j), init, reverse)
                for j, init in enumerate(inits)]
    out_cots = [(k, grads[k]) for k in range(n_out) if k in grads]
    state_cots = [(j, grads[n_out + j]) for j in range(n_state)
                  if keep and n_out + j in grads and is_float(inits[j])]
    float_states = [j for j in range(n_state) if is_float(inits[j])]
    float_invariants = [m for m, v in enumerate(invariants) if is_float(v)]
    float_seqs = [i for i, s in enumerate(seqs) if is_float(s) and wanted[i]]
    # invariants whose gradient is one product or sum over all steps, taken after
    # the loop from per-step values; the others are summed in a carried state
    used_by = _single_use(body)
    summed_after = {m: used_by[m] for m in float_invariants if used_by.get(m) is not None}
    accumulated = [m for m in float_invariants if m not in summed_after]

    def vjp_step(slices, carries):
        slices = list(slices)
        x_t = slices[:n_seq]
        prev_t = slices[n_seq:n_seq + n_state]
        cot_t = slices[n_seq + n_state:]
        out_cot_t, state_cot_t = cot_t[:len(out_cots)], cot_t[len(out_cots):]
        carried = dict(zip(float_states, carries[:len(float_states)]))
        sums = carries[len(float_states):]
        replacements = {p.id: v for p, v in zip(body.seq_inputs, x_t)}
        replacements.update({p.id: v for p, v in zip(body.state_inputs, prev_t)})
        # stand-ins, so that each invariant's gradient is its own partial derivative
        # even where one invariant is computed from another outside the loop
        stand_ins = [Placeholder(v.shape, v.dtype, name=f"{body.where} invariant") for v in invariants]
        replacements.update({p.id: v for p, v in zip(body.invariant_inputs, stand_ins)})
        users = [summed_after[m] for m in summed_after]
        forward = substitute(body.outputs + body.new_states + users, replacements)
        users, forward = forward[len(forward) - len(users):], forward[:len(forward) - len(users)]
        state_cot = dict(carried)
        for (j, _), c in zip(state_cots, state_cot_t):
            state_cot[j] = apply("add", state_cot[j], c)
        products = [(forward[k], c) for (k, _), c in zip(out_cots, out_cot_t)]
        products += [(forward[n_out + j], c) for j, c in state_cot.items()]
        wrt = ([x_t[i] for i in float_seqs] + [prev_t[j] for j in float_states]
               + [stand_ins[m] for m in accumulated] + users)
        total = _total(products)
        g = gradients(total, wrt) if total is not None else [None] * len(wrt)
        g = [zeros_like(w) if gi is None else gi for w, gi in zip(wrt, g)]
        n_x, n_prev, n_acc = len(float_seqs), len(float_states), len(accumulated)
        d_x, d_prev = g[:n_x], g[n_x:n_x + n_prev]
        d_acc, d_users = g[n_x + n_prev:n_x + n_prev + n_acc], g[n_x + n_prev + n_acc:]
        per_step = []  # what the product or sum after the loop needs from this step
        for user, d in zip(users, d_users):
            per_step += [user.inputs[0], d] if user.op == "dot" else [d]
        outputs = d_x + per_step
        carried = d_prev + [apply("add", s, d) for s, d in zip(sums, d_acc)]
        # one substitution for all, so that the values they share stay shared
        both = substitute(outputs + carried, {p.id: v for p, v in zip(stand_ins, invariants)})
        return both[:len(outputs)], both[len(outputs):]

    cot_seqs = [c for _, c in out_cots] + [c for _, c in state_cots]
    initial = []
    for j in float_states:
        final_cot = None if keep else grads.get(n_out + j)
        initial.append(zeros_like(inits[j]) if final_cot is None else final_cot)
    initial += [zeros_like(invariants[m]) for m in accumulated]
    stacked, finals = scan(vjp_step, seqs + previous + cot_seqs, initial, reverse=not reverse,
                           keep_history=False, where=body.where + " gradient")
    result = [None] * len(node.inputs)
    for i, d in zip(float_seqs, stacked):
        result[i] = d
    for j, d in zip(float_states, finals[:len(float_states)]):
        result[n_seq + j] = d
    for m, d in zip(accumulated, finals[len(float_states):]):
        result[n_seq + n_state + m] = d
    after = iter(stacked[len(float_seqs):])
    for m, user in summed_after.items():
        if user.op == "dot":  # sum over steps of left_t^T @ d_t: one product over all rows
            left, d = next(after), next(after)
            rows = [apply("reshape", v, shape=(-1, v.shape[-1])) for v in (left, d)]
            result[n_seq + n_state + m] = apply("dot", *rows, transpose_a=True)
        else:  # a bias broadcast along the batch: its gradient sums steps and rows
            result[n_seq + n_state + m] = apply("sum", next(after), axis=(0, 1))
    return result


def _single_use(body):
    """{invariant index: its one use} where that use makes the invariant's gradient
    a product (``dot(h_t, w)``: the sum over steps of h_t^T @ d_t) or a sum over the
    batch (``x_t + b`` with b broadcast along axis 0) at every step."""
    users = consumers_of(toposort(body.outputs + body.new_states))
    result = {}
    for m, ph in enumerate(body.invariant_inputs):
        use = users.get(ph.id, [])
        if len(use) != 1 or None in ph.shape:
            continue
        if _summable_after(use[0], ph):
            result[m] = use[0]
    return result


def _summable_after(use, ph):
    if len(use.inputs) != 2:
        return False
    left, right = use.inputs
    if use.op == "dot":
        return (right is ph and left is not ph and left.ndim == 2 and ph.ndim == 2
                and not use.attrs.get("transpose_a") and not use.attrs.get("transpose_b"))
    return (use.op == "add" and use.ndim == 2 and ph.ndim == 1 and left is not right
            and (left if right is ph else right).shape == use.shape)


def _numpy_scan(*arrays, body, reverse, keep_history, length):
    """The scan's NumPy form, its reference: the step evaluated node by node
    with NumPy, once per element of axis 0 (lowering.Scan runs it compiled).
    Its value: stacked per-step outputs, then the states (stacked or final)."""
    from ..evaluator import evaluate_graph  # it reads the registry this package fills
    n_seq, n_state = len(body.seq_inputs), len(body.state_inputs)
    seqs, states = arrays[:n_seq], list(arrays[n_seq:n_seq + n_state])
    invariants = arrays[n_seq + n_state:]
    steps = seqs[0].shape[0]
    if steps == 0 or any(s.shape[0] != steps for s in seqs):
        raise ValueError(f"{body.where}: the sequences must have one length > 0 along axis 0, "
                         "got " + ", ".join(str(np.shape(a)) for a in seqs))
    placeholders = body.seq_inputs + body.state_inputs + body.invariant_inputs
    targets = body.outputs + body.new_states
    n_out = len(body.outputs)
    outputs, history = [], []
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        feeds = {p.id: np.asarray(a) for p, a in
                 zip(placeholders, [s[t] for s in seqs] + states + list(invariants))}
        result = evaluate_graph(targets, feeds)
        outputs.append(result[:n_out])
        states = result[n_out:]
        history.append(states)
    if reverse:  # stacked in the sequences' order
        outputs.reverse()
        history.reverse()
    stacked = [np.stack([o[k] for o in outputs]) for k in range(n_out)]
    if keep_history:
        return tuple(stacked) + tuple(np.stack([h[j] for h in history]) for j in range(n_state))
    return tuple(stacked) + tuple(states)


def _scan_rows(node, axes):
    """The batches of a scan's items (ops/batch.py): its sequences carry the
    batch on axis 1 (axis 0 is time), its states and invariants on axis 0, or
    not at all, one entry per row; its step must keep each state's batch
    where it was and give outputs with the batch on axis 0 (the rows a
    compiled loop allocates); the stacked items then carry it on axis 1."""
    body = node.attrs["body"]
    n_seq, n_state = len(body.seq_inputs), len(body.state_inputs)
    seqs, states = axes[:n_seq], axes[n_seq:n_seq + n_state]
    invariants = axes[n_seq + n_state:]
    first = batch.Batch(0)
    if (any(b not in (None, batch.Batch(1)) for b in seqs)
            or any(b not in (None, first) for b in states + invariants)):
        raise batch.MixesRows("needs the batch on axis 1 of its sequences and on axis 0 of its "
                              "states and invariants, but they carry it on "
                              + ", ".join("no axis" if b is None else str(b) for b in axes))
    known = {p.id: None if b is None else first for p, b in zip(body.seq_inputs, seqs)}
    known.update({p.id: b for p, b in zip(body.state_inputs + body.invariant_inputs,
                                          states + invariants)})
    traced = batch.trace(body.outputs + body.new_states, known)
    outputs = [traced[t.id] for t in body.outputs]
    new_states = [traced[t.id] for t in body.new_states]
    for j, (before, after) in enumerate(zip(states, new_states)):
        if before != after:
            raise batch.MixesRows(f"has a step that turns state {j}, with the batch on "
                                  f"{before or 'no axis'}, into one with it on {after or 'no axis'}")
    if any(b not in (None, first) for b in outputs):
        raise batch.MixesRows("has a step whose outputs carry the batch elsewhere than on axis 0")
    stacked = [None if b is None else batch.Batch(1) for b in outputs + new_states]
    if node.attrs["keep_history"]:
        return tuple(stacked)
    return tuple(stacked[:len(outputs)] + new_states)


library("scan", _scan_infer, _numpy_scan, grad=_scan_grad, multi_output=True, grad_takes_wanted=True,
        grad_differentiates=True, rows=_scan_rows)


# ---------------------------------------------------------------------------
# Tracing and hoisting


def _batched(node, inputs, kinds):
    """``node`` applied to all steps at once (its sequence operands carry a leading
    step axis), or None where that is not the same op."""
    seq_operands = [i for i in node.inputs if kinds[i.id] == "seq"]
    op = OPS[node.op]
    if op.kind == "elementwise":
        # invariants no wider than the per-step operands broadcast the same way
        if all(i.ndim == node.ndim for i in seq_operands):
            return apply(node.op, *inputs, **node.attrs)
        return None
    if node.op == "dot" and kinds[node.inputs[0].id] == "seq" and kinds[node.inputs[1].id] == "inv" \
            and not node.attrs.get("transpose_a") and not node.attrs.get("transpose_b") \
            and not _product_stays_in_loop(node):
        return apply("dot", *inputs)
    if node.op == "getitem":
        return apply("getitem", inputs[0], key=(slice(None),) + node.attrs["key"])
    return None


def _product_stays_in_loop(node):
    """Whether a step's product of a sequence slice by an invariant matrix stays
    in the body, rather than running once over all steps before the scan: a 2-D
    product of floats, where compiled loops run.  The loop then computes it per
    step on the matrix packed once, or over all its steps at once where its
    rows are few (tuning.SCAN_IN_LOOP_MIN_ROWS): the W5 LSTM ran faster at
    batch 32 (its input projection neither written nor read again) and as fast
    at small batches (PERFORMANCE.md, W5)."""
    return is_float_matrix_product(node)


def scan(step, sequences, initial_states, reverse=False, keep_history=True, where="scan"):
    """Run ``step(slices, states) -> (outputs, new_states)`` along axis 0 of the
    sequences; returns (outputs stacked per step, states stacked per step when
    ``keep_history`` else their final values), as lists of tensors."""
    sequences = [as_tensor(s, where=where) for s in sequences]
    initial_states = [as_tensor(s, where=where) for s in initial_states]
    if not sequences:
        raise ValueError(f"{where}: nothing to scan over")
    for s in sequences:
        if s.ndim == 0:
            raise ValueError(f"{where}: a sequence must have rank >= 1, got a scalar")
    seq_ph = [Placeholder(s.shape[1:], s.dtype, name=f"{where} step input {i}")
              for i, s in enumerate(sequences)]
    state_ph = [Placeholder(s.shape, s.dtype, name=f"{where} state {j}")
                for j, s in enumerate(initial_states)]
    outputs, new_states = step(seq_ph, state_ph)
    outputs = [as_tensor(o, where=where) for o in outputs]
    new_states = [as_tensor(s, where=where) for s in new_states]
    if len(new_states) != len(state_ph):
        raise ValueError(f"{where}: the step returned {len(new_states)} state(s) for "
                         f"{len(state_ph)} initial state(s)")
    for j, (ph, new) in enumerate(zip(state_ph, new_states)):
        if new.dtype != ph.dtype:
            raise TypeError(f"{where}: the step returned state {j} of dtype {new.dtype}; "
                            f"its initial state has dtype {ph.dtype}")
        if new.ndim != ph.ndim or any(a is not None and b is not None and a != b
                                      for a, b in zip(new.shape, ph.shape)):
            raise ValueError(f"{where}: the step returned state {j} of shape "
                             f"{format_shape(new.shape)}; its initial state has shape "
                             f"{format_shape(ph.shape)}")
    if not outputs and not new_states:
        raise ValueError(f"{where}: the step returned no outputs and no states")
    targets = merge_sibling_dots(  # before the loop boundary hides the slices
        outputs + new_states)
    outputs, new_states = targets[:len(outputs)], targets[len(outputs):]
    kinds, outer = _classify(targets, seq_ph, state_ph, sequences)
    _keep_cheap_work_in_loop(targets, kinds, outer)

    # the boundary of the body: hoisted values and invariants it reads
    body_seq, body_seq_outer, body_inv, body_inv_outer = [], [], [], []
    replacements = {}

    def boundary(node):
        if node.id in replacements or kinds[node.id] == "state" or node.id not in outer:
            return
        if node.op == "constant":
            return
        ph = Placeholder(node.shape, node.dtype, name=f"{where} body input")
        replacements[node.id] = ph
        if kinds[node.id] == "seq":
            body_seq.append(ph)
            body_seq_outer.append(outer[node.id])
        else:
            body_inv.append(ph)
            body_inv_outer.append(outer[node.id])

    for node in toposort(targets):
        if node.id in outer:
            continue
        for i in node.inputs:
            boundary(i)
    stacked_direct = {}
    for k, t in enumerate(outputs):
        if kinds[t.id] == "seq" and t.id in outer:
            stacked_direct[k] = outer[t.id]  # the whole output was computed outside the loop
    if not new_states and len(stacked_direct) == len(outputs):
        return [stacked_direct[k] for k in range(len(outputs))], []
    for t in targets:
        boundary(t)
    if not body_seq:  # every step is the same: still one step per element
        ph = Placeholder(seq_ph[0].shape, seq_ph[0].dtype, name=f"{where} step input")
        body_seq.append(ph)
        body_seq_outer.append(sequences[0])
    body_targets = substitute(targets, replacements)
    # The loop stacks each value once, and none that was computed outside it:
    # a gradient's step returns a value once for each of its uses (an LSTM's
    # h_t-1 for each gate's product) and its sequences' own slices, each of
    # which the loop copied at every step.
    looped = {}  # output's node id -> its index among the body's outputs
    for k, t in enumerate(outputs):
        if k not in stacked_direct:
            looped.setdefault(t.id, (len(looped), k))
    body = Body(where, body_seq, state_ph, body_inv, [body_targets[k] for _, k in looped.values()],
                body_targets[len(outputs):])
    node = apply("scan", *body_seq_outer, *initial_states, *body_inv_outer, body=body,
                 reverse=reverse, keep_history=keep_history)
    items = [_item(node, i) for i in range(len(looped))]
    stacked = [stacked_direct[k] if k in stacked_direct else items[looped[t.id][0]]
               for k, t in enumerate(outputs)]
    states = [_item(node, len(looped) + j) for j in range(len(new_states))]
    return stacked, states


def _keep_cheap_work_in_loop(targets, kinds, outer):
    """Hoisted element-wise ops and slices that feed only the loop go back into
    it: there they fuse into the step's kernel instead of making a pass of their
    own over all steps (hoisting them pays only where a product follows)."""
    order = toposort(targets)
    consumers = consumers_of(order)
    target_ids = {t.id for t in targets}
    for node in reversed(order):
        if (kinds[node.id] != "seq" or node.id not in outer or node.id in target_ids
                or not node.inputs):
            continue
        if OPS[node.op].kind != "elementwise" and node.op != "getitem":
            continue
        if not any(c.id in outer for c in consumers.get(node.id, [])):
            del outer[node.id]


def _classify(targets, seq_ph, state_ph, sequences):
    """Each node's kind ('state': depends on a state; 'seq': on the sequences only;
    'inv': on neither) and, for nodes computable outside the loop, their outer
    value (over all steps for 'seq' nodes)."""
    kinds, outer = {}, {}
    seq_ids = {p.id: s for p, s in zip(seq_ph, sequences)}
    state_ids = {p.id for p in state_ph}
    for node in toposort(targets):
        if node.id in state_ids:
            kinds[node.id] = "state"
        elif node.id in seq_ids:
            kinds[node.id] = "seq"
            outer[node.id] = seq_ids[node.id]
        else:
            below = {kinds[i.id] for i in node.inputs}
            kind = "state" if "state" in below else "seq" if "seq" in below else "inv"
            kinds[node.id] = kind
            if kind == "inv":
                outer[node.id] = node
            elif kind == "seq" and all(i.id in outer for i in node.inputs) \
                    and not OPS[node.op].stateful:
                batched = _batched(node, [outer[i.id] for i in node.inputs], kinds)
                if batched is not None:
                    outer[node.id] = batched
    return kinds, outer

