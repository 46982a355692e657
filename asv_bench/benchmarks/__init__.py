
import os as _os

# Benchmarks time each tier as it runs once compiled: a later tier compiling on
# the background worker during the timed calls would time the plan beside a
# compile (a server warms up first: Function.warmup).
_os.environ.setdefault("NUMBACKEND_TUNE_TIER_COMPILE", "in_call")
# nor a native entry's build (numbackend/native.py), a process of its own beside the timed calls
_os.environ.setdefault("NUMBACKEND_TUNE_NATIVE_TIER", "off")
