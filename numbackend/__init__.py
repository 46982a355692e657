"""numbackend: a Keras backend that compiles to native CPU code through Numba."""
