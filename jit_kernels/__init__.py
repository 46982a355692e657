"""Precompiled Numba kernels on plain NumPy arrays.

This package knows nothing of numbackend's graph: every function takes and
returns NumPy arrays (or fills output arrays passed in).  Kernels are compiled
with ``cache=True`` so a second process loads them from disk.
"""
