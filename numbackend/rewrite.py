"""Rewrites of a function's graph before it is partitioned: common
sub-expressions merged, constants folded, products with slices of one matrix
merged, results shared with multi-output ops, unread scan histories dropped,
a switch on a constant replaced by its branch."""

from .evaluator import evaluate
from .graph import Constant, Tensor, substitute, toposort
from .ops import OPS, merge_sibling_dots


def _attrs_key(attrs):
    return repr(sorted(attrs.items()))


def read_shared_results(targets):
    """Nodes whose value an item of a multi-output node on the same inputs already
    holds (an op's ``computed_by``, e.g. a loss next to its loss-and-gradient
    pass) read it from there rather than computing it again."""
    order = toposort(targets)
    multi = {(n.op, tuple(i.id for i in n.inputs), _attrs_key(n.attrs)): n
             for n in order if n.op in OPS and OPS[n.op].multi_output}
    replacements = {}
    for node in order:
        shared = OPS[node.op].computed_by if node.op in OPS else None
        if shared is None:
            continue
        source = multi.get((shared[0], tuple(i.id for i in node.inputs), _attrs_key(node.attrs)))
        if source is not None:
            replacements[node.id] = Tensor("tuple_item", (source,),
                                           {"index": shared[1], "shape": node.shape,
                                            "dtype": node.dtype}, node.shape, node.dtype)
    return substitute(targets, replacements) if replacements else list(targets)


def rewrite(targets):
    """Merge common sub-expressions and fold constants; returns the new targets."""
    targets = read_shared_results(merge_sibling_dots(drop_unread_histories(targets)))
    replaced = {}
    seen = {}
    constants = {}
    for node in toposort(targets):
        if node.op in ("placeholder", "variable"):
            replaced[node.id] = node
            continue
        if node.op == "constant":
            key = None
            if node.value.size <= 64:
                key = (node.dtype, node.value.shape, node.value.tobytes())
                if key in constants:
                    replaced[node.id] = constants[key]
                    continue
                constants[key] = node
            replaced[node.id] = node
            continue
        inputs = [replaced[i.id] for i in node.inputs]
        if node.op in ("stop_gradient", "identity"):
            # only K.gradients reads stop_gradient, and identity is a copy (Keras's
            # layers that return their input): a plan step would split a fused
            # kernel and keep the function from its whole call.  A result that is
            # a leaf, a view of one or another result is still copied (Program.result_fresh).
            replaced[node.id] = inputs[0]
            continue
        chosen = _branch_of_constant_switch(node, inputs)
        if chosen is not None:
            replaced[node.id] = chosen
            continue
        op = OPS[node.op]
        if (not op.stateful and not op.multi_output and op.impl is not None
                and node.op != "print_tensor" and inputs and all(i.op == "constant" for i in inputs)):
            value = evaluate(node, [i.value for i in inputs])
            new = Constant(value, dtype=node.dtype)
            replaced[node.id] = new
            continue
        if op.stateful:
            key = ("stateful", node.id)
        else:
            key = (node.op, tuple(i.id for i in inputs), _attrs_key(node.attrs))
        if key in seen:
            replaced[node.id] = seen[key]
            continue
        if all(a is b for a, b in zip(inputs, node.inputs)):
            new = node
        else:
            new = _copy_node(node, inputs)
        seen[key] = new
        replaced[node.id] = new
    return [replaced[t.id] for t in targets]


def _branch_of_constant_switch(node, inputs):
    """The branch a 'where' node takes as it is, where its condition (``inputs[0]``)
    is one constant value and that branch has the node's static shape and dtype
    (K.switch on a learning phase fixed for the plan, see Function): TensorFlow's
    switch on a scalar runs the chosen branch alone.  Else None."""
    if node.op != "where" or inputs[0].op != "constant" or inputs[0].ndim != 0:
        return None
    branch = inputs[1] if inputs[0].value else inputs[2]
    return branch if branch.shape == node.shape and branch.dtype == node.dtype else None


def _copy_node(node, inputs):
    return Tensor(node.op, inputs, node.attrs, node.shape, node.dtype, node.name)


def drop_unread_histories(targets):
    """Scans that keep their states' history (for back-propagation) where nothing
    reads it (inference: an RNN's last output) keep only the final states, so a
    step copies its outputs alone.  Returns the new targets."""
    order = toposort(targets)
    reads = {}  # scan id -> indices of the items read; None when the whole tuple is
    for node in order:
        for i in node.inputs:
            if i.op != "scan":
                continue
            if node.op == "tuple_item" and reads.get(i.id, set()) is not None:
                reads.setdefault(i.id, set()).add(node.attrs["index"])
            else:
                reads[i.id] = None
    lean, replacements = {}, {}
    for node in order:
        scan = node.inputs[0] if node.op == "tuple_item" else None
        if (scan is None or scan.op != "scan" or not scan.attrs["keep_history"]
                or reads[scan.id] is None or max(reads[scan.id]) >= len(scan.attrs["body"].outputs)
                or any(t is scan for t in targets)):
            continue
        if scan.id not in lean:
            lean[scan.id] = Tensor("scan", scan.inputs, {**scan.attrs, "keep_history": False},
                                   scan.shape, scan.dtype)
        replacements[node.id] = Tensor("tuple_item", (lean[scan.id],), node.attrs,
                                       node.shape, node.dtype)
    return substitute(targets, replacements) if replacements else list(targets)
