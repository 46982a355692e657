"""Names Keras 2.2.5 requires whose implementation is not in this release yet.

Each raises NotImplementedError naming the missing feature, so that
``import keras`` works and a model that needs the feature fails clearly.
"""


def _missing(name, feature):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"{name}: {feature} is not implemented in numbackend yet")
    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f"Not implemented yet: {feature}."
    return fn


_FEATURES = {
    "the RNN scan": ("rnn", "foldl", "foldr", "map_fn"),
}

for _feature, _names in _FEATURES.items():
    for _name in _names:
        globals()[_name] = _missing(_name, _feature)

__all__ = [n for names in _FEATURES.values() for n in names]
