"""What survives ``os.fork``: numbackend runs in processes forked from a parent
that used it (multiprocessing's workers, Keras's ``use_multiprocessing``).

Two things do not survive a fork: Numba's OpenMP threads (the child runs its
kernels serially, :func:`parallel_ok`), and OpenBLAS's pool while a thread
works on it (a fork waits for that work, :class:`ForkGate`).
"""
import os
import sys
import threading
import warnings

# False in a process forked from one that had started Numba's thread pool:
# GNU OpenMP's threads do not survive fork, and Numba's omp layer terminates
# a child that enters a parallel region (a multiprocessing.Pool's workers died
# one after another and its map never returned).  Such a child runs every
# kernel on its calling thread instead.
_threads_usable = True


def _after_fork_in_child():
    global _threads_usable
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is not None and getattr(parallel, "_is_initialized", True):
        _threads_usable = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def parallel_ok():
    """Whether a kernel may run its parallel loop (Numba's threads): false in a
    child forked after this process started Numba's thread pool, where each
    kernel runs serially (with a warning, once)."""
    if _threads_usable:
        return True
    global _warned_serial
    if not _warned_serial:
        _warned_serial = True
        warnings.warn("numbackend: this process was forked from one that had started Numba's "
                      "threads, which do not survive fork; its kernels run on one thread",
                      RuntimeWarning, stacklevel=2)
    return False


_warned_serial = False


class ForkGate:
    """Work that may run on OpenBLAS's threads holds the gate; ``os.fork`` waits
    until no other thread does.

    OpenBLAS stops its pool before a fork (its pthread_atfork handler), and a
    thread then inside a product or a run of parts never returns: forking while
    another thread ran a model hung the parent (NumPy's own products do the same).
    ``enter``/``leave`` pair around such work; a thread already inside enters
    again without waiting, and a fork from inside waits only for the others.
    Each thread counts its entries in a slot of its own, which only it writes,
    so entering takes no lock (a call at batch 1 takes tens of microseconds).
    """

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._entries = {}  # thread id -> its entries
        self._forking = False

    def enter(self):
        me = threading.get_ident()
        entries = self._entries
        count = entries.get(me, 0)
        entries[me] = count + 1
        # counted before looking: a fork that starts now sees this entry and waits
        while self._forking and count == 0:
            entries[me] = 0
            with self._cond:
                while self._forking:
                    self._cond.wait()
            entries[me] = 1

    def leave(self):
        me = threading.get_ident()
        self._entries[me] -= 1
        if self._forking:
            with self._cond:
                self._cond.notify_all()

    def _others_inside(self, me):
        return any(count for thread, count in list(self._entries.items()) if thread != me)

    def _before_fork(self):
        me = threading.get_ident()
        with self._cond:
            self._forking = True
            while self._others_inside(me):
                self._cond.wait(0.01)

    def _after_fork_in_parent(self):
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def _after_fork_in_child(self):
        # the forking thread is the child's only one: its entries are all there are
        me = threading.get_ident()
        self._cond = threading.Condition(threading.Lock())
        self._entries = {me: self._entries.get(me, 0)}
        self._forking = False


fork_gate = ForkGate()
os.register_at_fork(before=fork_gate._before_fork, after_in_parent=fork_gate._after_fork_in_parent,
                    after_in_child=fork_gate._after_fork_in_child)
