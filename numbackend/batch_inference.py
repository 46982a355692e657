"""Batch inference over a Dask array: a compiled function called on each block.

Dask is an optional dependency (``pip install 'numbackend[dask]'``), imported
only when :func:`predict_blocks` is called."""
import numpy as np

from .runtime import Function


def predict_blocks(function, images, client=None):
    """``function``'s output over the Dask array ``images``, computed block by block
    along axis 0: a lazy Dask array (``.compute()`` runs it).

    ``function`` is a ``K.function`` of one input and one output, its output's
    shape known but for axis 0: for a Keras model,
    ``K.function(model.inputs, model.outputs)`` (the learning phase is then not
    an input and stays 0: the predict plan).  Each block holds whole rows of
    ``images`` (it is rechunked so where it is not).

    On a distributed cluster (``client``, by default the current
    ``distributed`` client if there is one) the function is pickled once and
    sent to every worker, which unpickles it once, building it again from its
    graph (see ``Function.__reduce__``); every block a worker computes then
    calls that copy.  Workers given the same ``NUMBACKEND_CACHE_DIR``, warmed
    by a first call here, load its kernels and compile nothing.  Without a
    cluster the blocks call ``function`` itself."""
    import dask.array as da

    if not isinstance(function, Function):
        raise TypeError(f"predict_blocks: function must be a K.function with dense inputs and "
                        f"outputs, got {type(function).__name__}")
    if len(function.inputs) != 1 or len(function.outputs) != 1:
        raise ValueError(f"predict_blocks: function must have one input and one output, it has "
                         f"{len(function.inputs)} input(s) and {len(function.outputs)} output(s)")
    if not isinstance(images, da.Array):
        raise TypeError(f"predict_blocks: images must be a dask array, got {type(images).__name__}")
    placeholder, output = function.inputs[0], function.outputs[0]
    if images.ndim != placeholder.ndim or any(
            known is not None and known != size for known, size in
            zip(placeholder.shape[1:], images.shape[1:])):
        raise ValueError(f"predict_blocks: the function's input {placeholder.name!r} has shape "
                         f"{placeholder.shape}, images have shape {images.shape}")
    if None in output.shape[1:]:
        raise ValueError(f"predict_blocks: the function's output {output.name!r} has shape "
                         f"{output.shape}: only axis 0 may be of unknown size")
    images = images.rechunk({axis: -1 for axis in range(1, images.ndim)})
    if client is None:
        client = _current_client()
    if client is not None:
        function = client.scatter(function, broadcast=True, hash=False)
    # map_blocks keeps the input's axes: the output's others are dropped or added
    in_ndim, out_ndim = images.ndim, len(output.shape)
    return images.map_blocks(
        _call_on_block, function, dtype=np.dtype(output.dtype),
        chunks=(images.chunks[0],) + tuple((size,) for size in output.shape[1:]),
        drop_axis=list(range(out_ndim, in_ndim)), new_axis=list(range(in_ndim, out_ndim)) or None)


def _call_on_block(block, function):
    outputs = function([block])
    return outputs if function.single_output else outputs[0]


def _current_client():
    """The current ``distributed`` client, or None where there is none."""
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:  # no client
        return None
