"""CTC decoders: greedy (``tf.nn.ctc_greedy_decoder``), prefix beam search
(``tf.nn.ctc_beam_search_decoder``) and the dictionary-constrained beam search
of Keras 1's ``ctc_decode`` (see :mod:`jit_kernels.ctc` for the conventions).
"""
import math

import numba
import numpy as np

from .compiling import njit_cached
from .ctc_args import NEG_INF, as_lengths, as_logits, log_softmax, padded_paths
from .ctc_loss import loss_rows

# ---------------------------------------------------------------------------
# Greedy (best path) decoding


@njit_cached(error_model="numpy")
def _greedy_kernel(logits, input_lengths, merge_repeated, decoded, decoded_lengths, neg_sum):
    """Best path of each sample.  Serial: one pass of comparisons over the
    logits costs less than waking the threads of a parallel loop."""
    n_classes = logits.shape[2]
    blank = n_classes - 1
    for b in range(logits.shape[0]):
        count = 0
        previous = -1
        total = 0.0
        for t in range(input_lengths[b]):
            # First maximum wins ties, as in TF's RowMax.
            best = 0
            best_value = logits[b, t, 0]
            for c in range(1, n_classes):
                if logits[b, t, c] > best_value:
                    best = c
                    best_value = logits[b, t, c]
            total -= best_value
            if best != blank and not (merge_repeated and best == previous):
                decoded[b, count] = best
                count += 1
            previous = best
        decoded_lengths[b] = count
        neg_sum[b, 0] = total


def ctc_greedy_decode(logits, input_lengths, merge_repeated=True):
    """Best-path decoding, as ``tf.nn.ctc_greedy_decoder``.

    Takes the most likely class of each frame (the first one on ties), merges
    runs of the same class when ``merge_repeated`` (a blank between two equal
    classes keeps both), then drops blanks.

    Args:
        logits: (batch, time, classes); blank = classes - 1.
        input_lengths: (batch,) or (batch, 1), each in 0..time.
        merge_repeated: merge consecutive equal classes (TF's default, and
            what Keras's ``ctc_decode(greedy=True)`` uses).

    Returns:
        decoded: (batch, longest decoded length) int64, padded with -1 (the
            dense form Keras makes of TF's sparse result).
        neg_sum_logits: (batch, 1), minus the sum over the used frames of each
            frame's largest logit: TF's "log probability" of the greedy
            decoder.  It is taken on the logits as given, not log-softmaxed,
            so it is a negative log-probability only when the logits are
            normalised (Keras's ``log(y_pred + epsilon)`` nearly is).
            Summed in float64.
    """
    logits = as_logits(logits)
    batch, n_time, _ = logits.shape
    input_lengths = as_lengths(input_lengths, batch, n_time, "input_lengths")
    decoded = np.empty((batch, n_time), dtype=np.int64)
    decoded_lengths = np.empty(batch, dtype=np.int64)
    neg_sum = np.empty((batch, 1), dtype=np.float64)
    _greedy_kernel(logits, input_lengths, bool(merge_repeated), decoded, decoded_lengths,
                   neg_sum)
    longest = int(decoded_lengths.max()) if batch else 0
    used = np.arange(longest)[None, :] < decoded_lengths[:, None]
    dense = np.where(used, decoded[:, :longest], -1)
    return dense, neg_sum.astype(logits.dtype)


@njit_cached(nogil=True)
def greedy_decode_packed(logits, input_lengths, packed):
    """:func:`ctc_greedy_decode` (repeats merged) for compiled code, each row's
    results in one row of ``packed``, (batch, 1, 1 + time) float64:
    ``packed[b, 0, 0]`` the row's neg_sum_logits, ``packed[b, 0, 1:]`` its
    labels padded with -1 to the full width of the time steps (no decoding is
    longer), so that a row's results do not depend on the other rows'.

    ``input_lengths`` (batch,), of any number type, is read as
    :func:`ctc_greedy_decode` reads it (truncated to an integer); ValueError
    where one is outside 0..time or their count is not the batch's."""
    batch, n_time = logits.shape[0], logits.shape[1]
    if input_lengths.shape[0] != batch or packed.shape != (batch, 1, 1 + n_time):
        raise ValueError("jit_kernels.ctc_decode.greedy_decode_packed: the lengths or the packed "
                         "results do not fit the logits' batch and time steps")
    lengths = np.empty(batch, dtype=np.int64)
    for b in range(batch):
        # the truncation of a float lands in 0..time exactly where it lies in (-1, time + 1)
        if not (input_lengths[b] > -1 and input_lengths[b] < n_time + 1):
            raise ValueError("jit_kernels.ctc_decode.greedy_decode_packed: an input length is "
                             "outside 0..time")
        lengths[b] = np.int64(input_lengths[b])
    decoded = np.empty((batch, n_time), dtype=np.int64)
    decoded_lengths = np.empty(batch, dtype=np.int64)
    neg_sum = np.empty((batch, 1), dtype=np.float64)
    _greedy_kernel(logits, lengths, True, decoded, decoded_lengths, neg_sum)
    for b in range(batch):
        packed[b, 0, 0] = neg_sum[b, 0]
        for t in range(n_time):
            packed[b, 0, 1 + t] = decoded[b, t] if t < decoded_lengths[b] else -1.0


# ---------------------------------------------------------------------------
# Prefix beam search


# Columns of the prefix tree: each node is a label prefix, node 0 the empty
# one; a node's children are linked in increasing label order.
_PARENT, _LABEL_OF, _FIRST_CHILD, _NEXT_SIBLING = 0, 1, 2, 3
# Columns of a node's log-probabilities: of the frames so far collapsing to its
# prefix (total), and of those ending in a blank or in its last label.
_TOTAL, _BLANK, _LABEL = 0, 1, 2


class _PrefixTree:
    """Label prefixes as a tree of nodes in an int64 array (one row per node:
    parent, last label, first child, next sibling; -1 for none); node 0 is
    the empty prefix.  The free beam search adds nodes as it needs them; a
    tree built from a dictionary is fixed, and ``is_word`` marks its entries.
    """

    def __init__(self, capacity=64):
        self.nodes = np.full((capacity, 4), -1, dtype=np.int64)
        self.n_nodes = 1
        self.is_word = None

    def sequence(self, node):
        """The labels of a node's prefix."""
        out = []
        while node > 0:
            out.append(int(self.nodes[node, _LABEL_OF]))
            node = int(self.nodes[node, _PARENT])
        return out[::-1]

    @classmethod
    def from_words(cls, words):
        index = {(): 0}
        for word in words:
            for end in range(1, len(word) + 1):
                index.setdefault(tuple(word[:end]), len(index))
        tree = cls(len(index))
        tree.n_nodes = len(index)
        tree.is_word = np.zeros(len(index), dtype=bool)
        tree.is_word[[index[tuple(word)] for word in words]] = True
        # Link children in decreasing label order, each in front of the last.
        for prefix in sorted(index, key=lambda p: (len(p), p), reverse=True)[:-1]:
            node, parent = index[prefix], index[prefix[:-1]]
            tree.nodes[node, _PARENT] = parent
            tree.nodes[node, _LABEL_OF] = prefix[-1]
            tree.nodes[node, _NEXT_SIBLING] = tree.nodes[parent, _FIRST_CHILD]
            tree.nodes[parent, _FIRST_CHILD] = node
        return tree


# The helpers below are compiled once each rather than inlined (inline="always"),
# which typed and lowered them again at each call: the kernel compiled slower.


@numba.njit
def _log_add(a, b):
    """log(exp(a) + exp(b)), as TensorFlow's LogSumExp."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    return max(a, b) + math.log1p(math.exp(min(a, b) - max(a, b)))


@numba.njit
def _heap_push(heap, size, node, prob):
    """Adds node to the min-heap heap[:size] keyed by prob[node, _TOTAL]; the new size."""
    i = size
    while i > 0:
        up = (i - 1) // 2
        if prob[heap[up], _TOTAL] <= prob[node, _TOTAL]:
            break
        heap[i] = heap[up]
        i = up
    heap[i] = node
    return size + 1


@numba.njit
def _heap_pop(heap, size, prob):
    """Removes the least probable node of heap[:size]; (that node, the new size)."""
    bottom = heap[0]
    size -= 1
    last = heap[size]
    i = 0
    while 2 * i + 1 < size:
        child = 2 * i + 1
        if child + 1 < size and prob[heap[child + 1], _TOTAL] < prob[heap[child], _TOTAL]:
            child += 1
        if prob[heap[child], _TOTAL] >= prob[last, _TOTAL]:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = last
    return bottom, size


@numba.njit
def _best_first(leaves, size, prob, out):
    """out[:size] = leaves[:size] ordered by prob[:, _TOTAL], most probable first,
    ties in their order in leaves: a stable argsort of -prob[leaves[:size], _TOTAL].

    An insertion sort filling out from the back, each node moving right past
    those that go before it: leaves is a min-heap, roughly least probable
    first, so each new node mostly stays where it is put.  (np.argsort's merge
    sort took seconds to compile.)"""
    for i in range(size):
        node = leaves[i]
        total = prob[node, _TOTAL]
        j = size - 1 - i
        while j + 1 < size:
            other = prob[out[j + 1], _TOTAL]
            if total > other or (math.isnan(other) and not math.isnan(total)):
                break  # node goes first (nan last, as np.argsort puts -nan)
            out[j] = out[j + 1]
            j += 1
        out[j] = node


@numba.njit
def _is_candidate(log_prob, leaves, size, beam_width, prob):
    """TF's is_candidate: nonzero, and the beam has room or its least probable is less."""
    return log_prob > NEG_INF and (size < beam_width or log_prob > prob[leaves[0], _TOTAL])


@njit_cached(error_model="numpy")
def _beam_search_kernel(log_probs, start, beam_width, nodes, n_nodes, grow, new, old, leaves,
                        size):
    """TensorFlow's CTCBeamSearchDecoder::Step over frames start.. of log_probs,
    default scorer, while the tree has room for a frame's new nodes; returns
    (the frame reached, the beam's size, the tree's node count).

    log_probs is one sample's (frames, classes) log-softmax; nodes the prefix
    tree (see :class:`_PrefixTree`) of n_nodes nodes, extended when grow, else
    fixed (a dictionary: extensions outside it are skipped).  The search's
    state, updated in place: new and old (a row per node: its log-
    probabilities after this frame and after the last, see _TOTAL), and the
    beam, leaves[:size] (a min-heap on new[:, _TOTAL]).  The tree grows in
    Python (:func:`_beam_search`): Numba took seconds to compile growing it.

    Per frame, as TF: the beam's entries, best first, become the branches and
    each is updated in place (a blank, or a repeat of its last label; plus
    the extension of its parent by its last label when the parent was in the
    beam), then put back in the beam.  Then each branch, best first, whose
    previous probability beats the beam's least probable entry (or the beam
    has room) is extended by each label in turn: an extension whose prefix is
    not in the beam now enters with the extension's probability alone when
    it beats the least probable entry, which leaves the beam and is zeroed;
    otherwise both its probabilities are zeroed, so a branch that had left
    the beam earlier in this frame is then extended no more.  Extending by
    the last label needs a blank in between, so it starts from the branch's
    blank probability.
    """
    n_labels = log_probs.shape[1] - 1
    blank = n_labels
    branches = np.empty(beam_width, dtype=np.int64)
    for t in range(start, log_probs.shape[0]):
        if grow and n_nodes + size * n_labels > nodes.shape[0]:
            return t, size, n_nodes
        lp = log_probs[t]
        n_branches = size
        _best_first(leaves, size, new, branches)
        for i in range(n_branches):
            for k in range(3):
                old[branches[i], k] = new[branches[i], k]
        # typed: Numba compiles a callee once more for each literal argument
        # it is first typed with
        size = np.int64(0)
        for i in range(n_branches):
            b = branches[i]
            if b != 0:
                parent = nodes[b, _PARENT]
                label = nodes[b, _LABEL_OF]
                if new[parent, _TOTAL] > NEG_INF:  # the parent is in the beam
                    if label == nodes[parent, _LABEL_OF]:
                        previous = old[parent, _BLANK]
                    else:
                        previous = old[parent, _TOTAL]
                    new[b, _LABEL] = _log_add(new[b, _LABEL], previous)
                new[b, _LABEL] += lp[label]
            new[b, _BLANK] = old[b, _TOTAL] + lp[blank]
            new[b, _TOTAL] = _log_add(new[b, _BLANK], new[b, _LABEL])
            size = _heap_push(leaves, size, b, new)

        for i in range(n_branches):
            b = branches[i]
            if not _is_candidate(old[b, _TOTAL], leaves, size, beam_width, new):
                continue
            child = nodes[b, _FIRST_CHILD]
            before = -1  # the child before `child`, to link a new node after
            for label in range(n_labels):
                while child >= 0 and nodes[child, _LABEL_OF] < label:
                    before = child
                    child = nodes[child, _NEXT_SIBLING]
                c = child if child >= 0 and nodes[child, _LABEL_OF] == label else -1
                if c < 0 and not grow:
                    continue
                if c >= 0 and new[c, _TOTAL] > NEG_INF:  # in the beam
                    continue
                if label == nodes[b, _LABEL_OF]:
                    extension = lp[label] + old[b, _BLANK]
                else:
                    extension = lp[label] + old[b, _TOTAL]
                if _is_candidate(extension, leaves, size, beam_width, new):
                    if c < 0:
                        c = n_nodes
                        n_nodes += 1
                        nodes[c, _PARENT] = b
                        nodes[c, _LABEL_OF] = label
                        nodes[c, _NEXT_SIBLING] = child
                        if before < 0:
                            nodes[b, _FIRST_CHILD] = c
                        else:
                            nodes[before, _NEXT_SIBLING] = c
                        before = c
                    if size == beam_width:
                        bottom, size = _heap_pop(leaves, size, new)
                        for k in range(3):
                            new[bottom, k] = NEG_INF
                    new[c, _BLANK] = NEG_INF
                    new[c, _LABEL] = extension
                    new[c, _TOTAL] = extension
                    size = _heap_push(leaves, size, c, new)
                elif c >= 0:
                    for k in range(3):
                        new[c, k] = NEG_INF
                        old[c, k] = NEG_INF
    return log_probs.shape[0], size, n_nodes


def _grown(rows, capacity, fill):
    """rows with more rows of fill, up to capacity."""
    more = np.full((capacity - rows.shape[0], rows.shape[1]), fill, dtype=rows.dtype)
    return np.concatenate([rows, more])


def _beam_search(log_probs, beam_width, tree, grow):
    """Runs :func:`_beam_search_kernel` on ``tree`` (a :class:`_PrefixTree`, kept
    up to date, grown as the search needs); returns (the beam's nodes, their
    log-probabilities), best first."""
    log_probs = np.ascontiguousarray(log_probs, dtype=np.float64)
    n_labels = log_probs.shape[1] - 1
    new = np.full((tree.nodes.shape[0], 3), NEG_INF)
    old = np.full_like(new, NEG_INF)
    new[0, _TOTAL] = new[0, _BLANK] = 0.0  # the empty prefix, certain before frame 0
    leaves = np.zeros(beam_width, dtype=np.int64)  # the beam: the empty prefix alone
    frame, size = 0, 1
    while True:
        frame, size, tree.n_nodes = _beam_search_kernel(
            log_probs, frame, beam_width, tree.nodes, tree.n_nodes, grow, new, old, leaves, size)
        if frame == log_probs.shape[0]:
            break
        capacity = tree.nodes.shape[0]
        while capacity < tree.n_nodes + size * n_labels:
            capacity *= 2
        tree.nodes = _grown(tree.nodes, capacity, -1)
        new, old = _grown(new, capacity, NEG_INF), _grown(old, capacity, NEG_INF)
    beam = leaves[:size][np.argsort(-new[leaves[:size], _TOTAL], kind="mergesort")]
    return beam, new[beam, _TOTAL]


def _merge_runs(sequence):
    """TF's merge_repeated on a decoded sequence: a run of one label becomes one label."""
    return [label for i, label in enumerate(sequence) if i == 0 or label != sequence[i - 1]]


def _check_beam_args(beam_width, top_paths, where="ctc"):
    if beam_width < 1:
        raise ValueError(f"{where}: beam_width must be >= 1, got {beam_width}")
    if not 1 <= top_paths <= beam_width:
        raise ValueError(f"{where}: top_paths must lie in 1..beam_width ({beam_width}), "
                         f"got {top_paths}")


def _collect_top_paths(per_sample, top_paths, dtype):
    """Dense outputs from per-sample lists of (sequence, log_prob), best first.

    Missing paths (fewer candidates than top_paths) are empty sequences with
    log-probability -inf.
    """
    batch = len(per_sample)
    log_probs = np.full((batch, top_paths), NEG_INF)
    paths = [[[] for _ in range(batch)] for _ in range(top_paths)]
    for b, found in enumerate(per_sample):
        for k, (sequence, log_prob) in enumerate(found[:top_paths]):
            paths[k][b] = sequence
            log_probs[b, k] = log_prob
    return [padded_paths(p, batch) for p in paths], log_probs.astype(dtype)


def ctc_beam_search_decode(logits, input_lengths, beam_width=100, top_paths=1,
                           merge_repeated=False, where="ctc"):
    """Prefix beam search, as ``tf.nn.ctc_beam_search_decoder`` (default scorer).

    Reproduces TensorFlow's CTCBeamSearchDecoder step by step (see
    :func:`_beam_search_kernel`), with its normalisation of the logits
    (log-softmax per frame, TensorFlow 1.11 and later, which Keras 2.2.5's
    tests assume), in float64.  Its pruning is more than keeping the
    ``beam_width`` most probable prefixes: an entry that leaves the beam
    during a frame and is then offered again as an extension is extended no
    more in that frame.  Only ties may be ordered differently.

    Args:
        logits: (batch, time, classes); log-softmax is applied per frame.
        input_lengths: (batch,) or (batch, 1), each in 0..time.
        beam_width: number of prefixes kept after each frame.
        top_paths: number of decodings returned per sample, 1..beam_width.
        merge_repeated: as TF, merge runs of the same label in the returned
            sequences (so that "a a" decodes as "a"); the log-probabilities
            are those of the unmerged prefixes, and two prefixes that merge
            to the same sequence are returned apart.  Keras 2.2.5's
            ``ctc_decode`` passes False, the default here.
        where: the name errors start with.

    Returns:
        decoded: list of ``top_paths`` int64 arrays, the k-th (batch, longest
            k-th decoding) with the k-th most probable decoding of each
            sample, padded with -1.
        log_probs: (batch, top_paths) log-probability of each decoding: the
            probability that the frames collapse to that label sequence,
            summed over the alignments the beam kept; non-increasing along
            each row.

    A sample whose beam holds fewer than ``top_paths`` prefixes (too few
    frames or classes for that many) is an error, as in TensorFlow ("Less
    leaves in the beam search than requested").
    """
    logits = as_logits(logits, where)
    batch, n_time, _ = logits.shape
    input_lengths = as_lengths(input_lengths, batch, n_time, "input_lengths", where)
    beam_width, top_paths = int(beam_width), int(top_paths)
    _check_beam_args(beam_width, top_paths, where)
    per_sample = []
    for b in range(batch):
        tree = _PrefixTree()
        nodes, totals = _beam_search(log_softmax(logits[b, :input_lengths[b]]), beam_width,
                                     tree, grow=True)
        if len(nodes) < top_paths:
            raise ValueError(f"{where}: sample {b} has {len(nodes)} prefixes in its beam after "
                             f"{input_lengths[b]} frames, fewer than top_paths={top_paths} "
                             f"(TensorFlow: \"Less leaves in the beam search than requested\")")
        found = []
        for node, total in zip(nodes[:top_paths].tolist(), totals[:top_paths].tolist()):
            sequence = tree.sequence(node)
            found.append((_merge_runs(sequence) if merge_repeated else sequence, total))
        per_sample.append(found)
    return _collect_top_paths(per_sample, top_paths, logits.dtype)


# ---------------------------------------------------------------------------
# Dictionary-constrained decoding (the Keras 1 ctc_decode form)


def _dictionary_words(dict_seq_lens, dict_values, n_classes):
    """The dictionary as a list of distinct label tuples, first occurrence first."""
    if dict_values is None:
        raise ValueError("ctc: dict_values (the dictionary) is required")
    words = []
    for i, value in enumerate(dict_values):
        word = np.asarray(value, dtype=np.int64).reshape(-1)
        if dict_seq_lens is not None:
            length = int(np.asarray(dict_seq_lens).reshape(-1)[i])
            if not 0 <= length <= len(word):
                raise ValueError(f"ctc: dict_seq_lens[{i}] = {length} does not fit "
                                 f"dict_values[{i}] of length {len(word)}")
            word = word[:length]
        if word.size and (word.min() < 0 or word.max() >= n_classes - 1):
            raise ValueError(f"ctc: dictionary labels must lie in 0..{n_classes - 2}, "
                             f"got {word.tolist()} in entry {i}")
        words.append(tuple(word.tolist()))
    if dict_seq_lens is not None and np.asarray(dict_seq_lens).size != len(words):
        raise ValueError("ctc: dict_seq_lens and dict_values must have the same length")
    if not words:
        raise ValueError("ctc: the dictionary is empty")
    return list(dict.fromkeys(words))


def ctc_dictionary_decode(logits, input_lengths, dict_seq_lens, dict_values, beam_width=None,
                          top_paths=1):
    """Decoding constrained to the words of a dictionary (Keras 1 ``ctc_decode`` form).

    Keras 1's ``ctc_decode(y_pred, input_length, greedy=True, beam_width=None,
    dict_seq_lens=None, dict_values=None)`` documents "a constrained
    dictionary search": with ``greedy=False`` the decoding is one of the
    dictionary's entries (``dict_values``, a list of label lists, entry i
    of length ``dict_seq_lens[i]``), and "if beam_width is not None, the
    constrained dictionary search uses a beam of this width".  Its TF code
    passed these arguments to a TF decoder that never accepted them, so there
    is no reference result; this function implements the documented intent:

    * ``beam_width=None``: exact search.  Every entry is scored by its CTC
      probability, summed over all alignments (the CTC loss forward pass),
      and the ``top_paths`` most probable entries are returned.
    * ``beam_width=n``: the prefix beam search of ``ctc_beam_search_decode``
      where a prefix may only be extended into a prefix of some entry; after
      the last frame the beam's complete entries are ranked by their
      probability.  Its cost does not grow with the dictionary's size (the
      exact search's does); approximate (an entry pruned from the beam is
      lost); exact when the beam holds every prefix.

    Duplicate entries count once.  Entries that cannot be aligned (too long
    for the input) have probability zero and are never returned: missing
    decodings are empty with log-probability -inf.

    Args:
        logits: (batch, time, classes); blank = classes - 1.
        input_lengths: (batch,) or (batch, 1), each in 0..time.
        dict_seq_lens: length of each dictionary entry, or None for the
            entries' own lengths.
        dict_values: the dictionary: a sequence of label sequences (or a
            padded 2-D array read with ``dict_seq_lens``).
        beam_width: None for the exact search, else the beam width.
        top_paths: number of decodings returned per sample.

    Returns:
        decoded: list of ``top_paths`` (batch, longest) int64 arrays padded
            with -1, the k-th holding each sample's k-th best entry.
        log_probs: (batch, top_paths), best first.
    """
    logits = as_logits(logits)
    batch, n_time, n_classes = logits.shape
    input_lengths = as_lengths(input_lengths, batch, n_time, "input_lengths")
    words = _dictionary_words(dict_seq_lens, dict_values, n_classes)
    top_paths = int(top_paths)
    if beam_width is not None:
        beam_width = int(beam_width)
        _check_beam_args(beam_width, top_paths)
        tree = _PrefixTree.from_words(words)
        per_sample = []
        for b in range(batch):
            nodes, totals = _beam_search(log_softmax(logits[b, :input_lengths[b]]), beam_width,
                                         tree, grow=False)
            words_found = tree.is_word[nodes] & (totals > NEG_INF)
            nodes, totals = nodes[words_found][:top_paths], totals[words_found][:top_paths]
            per_sample.append([(tree.sequence(node), total)
                               for node, total in zip(nodes.tolist(), totals.tolist())])
        return _collect_top_paths(per_sample, top_paths, logits.dtype)

    if top_paths < 1:
        raise ValueError(f"ctc: top_paths must be >= 1, got {top_paths}")
    n_words = len(words)
    longest = max(len(w) for w in words)
    word_labels = np.zeros((n_words, longest), dtype=np.int64)
    for i, word in enumerate(words):
        word_labels[i, :len(word)] = word
    word_lengths = np.array([len(w) for w in words], dtype=np.int64)
    # One kernel row per (sample, entry) pair; the loss kernel's signature
    # (loss in the logits' dtype) is reused.
    loss = np.empty(batch * n_words, dtype=logits.dtype)
    loss_rows(logits, np.repeat(np.arange(batch, dtype=np.int64), n_words),
              np.tile(word_labels, (batch, 1)), np.tile(word_lengths, batch), input_lengths, False,
              loss, np.empty((len(loss), 0, 0), dtype=logits.dtype))
    word_log_probs = -loss.reshape(batch, n_words)
    per_sample = []
    for b in range(batch):
        best = np.argsort(-word_log_probs[b], kind="stable")[:top_paths]
        per_sample.append([(list(words[i]), word_log_probs[b, i]) for i in best.tolist()
                           if word_log_probs[b, i] > NEG_INF])
    return _collect_top_paths(per_sample, top_paths, logits.dtype)
