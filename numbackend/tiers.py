"""Later tiers compile off the serving path.

A function starts on its Python plan; later tiers (the plan compiled as one
call, a scan's loop over time) need a Numba compile of seconds.  Such a
compile is a :class:`Job`: :func:`submit` queues it for one worker thread
shared by the process (so that several functions never compile at once), and
the calls go on running the current tier until ``job.done``; then they swap
to the new one.  A job that fails keeps its error, and the function keeps
its current tier.

``tuning.TIER_COMPILE = "in_call"`` runs every job in the calling thread,
at once (tests and benchmarks that measure a given tier); so does a thread
inside :func:`warming` (``Function.warmup``), where the thresholds of the
later tiers count as reached.

The worker is a daemon thread: exit never waits for it.  It holds
jit_kernels' fork gate while it compiles (a fork waits for that compile:
Numba's compiler lock must not be copied held), and a process forked from
this one starts its own worker when it first needs it, running the jobs
that were still queued.
"""
import contextlib
import os
import queue
import sys
import threading
import warnings

from . import tuning


class Job:
    """One compile: ``work()`` run once, on the worker or in the calling thread.
    ``done`` once it ran; then ``result`` is what it returned, or ``error`` the
    exception it raised."""

    def __init__(self, what, work):
        self.what = what
        self.work = work
        self.result = None
        self.error = None
        self._finished = threading.Event()

    @property
    def done(self):
        if self._finished.is_set():
            return True
        _ensure_worker()  # in a forked child: its jobs are queued again there
        return False

    def wait(self, timeout=None):
        """Wait until the job ran (at most ``timeout`` seconds); whether it did."""
        if not self.done:
            self._finished.wait(timeout)
        return self._finished.is_set()

    def _run(self):
        try:
            self.result = self.work()
        except Exception as exc:  # noqa: BLE001 - kept for the owner, which keeps its tier
            self.error = exc
        self.work = None
        self._finished.set()


class Later:
    """A later tier of one owner (a function's whole call, a scan's loop over
    time): compiled once, as a :class:`Job`, by the first call that finds it
    due, while the owner goes on with its current tier.  ``warning`` says what
    runs where the compile fails."""

    def __init__(self, what, warning):
        self.what = what
        self.warning = warning
        self.failure = None  # why it did not compile, where it did not
        self._job = None
        self._start_lock = threading.Lock()

    def ready(self, work):
        """Whether the tier has compiled (its value is then :attr:`result`): the
        first call submits ``work()`` (a function making the compile's work, so
        that only the first call pays for it); waited for only inside
        :func:`warming_up`; False while it compiles, and where it failed (warned
        once, the reason in :attr:`failure`)."""
        job = self._job
        if job is None:
            with self._start_lock:  # one compile, whichever thread comes first
                job = self._job
                if job is None:
                    job = self._job = submit(self.what, work())
        if not job.done:
            if not warming():
                return False
            job.wait()
        if job.error is not None:
            if self.failure is None:
                self.failure = f"{type(job.error).__name__}: {str(job.error)[:200]}"
                warnings.warn(f"{self.warning} ({self.failure})", stacklevel=6)
            return False
        return True

    @property
    def result(self):
        return self._job.result

    @property
    def started(self):
        return self._job is not None

    @property
    def compiling(self):
        return self._job is not None and not self._job.done

    @property
    def error(self):
        return None if self._job is None else self._job.error

    def wait(self, timeout=None):
        """Wait until the compile ran (at most ``timeout`` seconds); whether it did."""
        return self._job is not None and self._job.wait(timeout)


class LaterPart:
    """A jit_kernels.parts compiled part as a later tier: its compile (a few
    hundredths of a second; a load where the cache has it) runs on the tiers'
    worker from the first call that asks for it, which does without it
    meanwhile (``instead``, in words), so that no call after a function's first
    waits for a compile; at once where tiers compile in the call
    (tuning.TIER_COMPILE, a warm-up)."""

    def __init__(self, part, what, instead):
        self.part = part
        self.compiled = False
        self.later = Later(what, f"numbackend: {what} did not compile, so {instead}")

    def ready(self):
        """Whether the part is compiled (its compile starts at the first ask)."""
        if not self.compiled:
            self.compiled = self.later.ready(lambda: self.part)
        return self.compiled


_local = threading.local()
_lock = threading.Lock()
_queue = None
_worker = None
_worker_pid = None
_queued = []  # jobs given to the worker and not run yet (queued again in a forked child)


def in_call():
    """Whether jobs submitted now run in the calling thread (tuning.TIER_COMPILE is
    "in_call", or this thread is inside :func:`warming`)."""
    return tuning.TIER_COMPILE == "in_call" or getattr(_local, "warming", False)


def warming():
    """Whether this thread is inside :func:`warming_up`: later tiers compile at once."""
    return getattr(_local, "warming", False)


@contextlib.contextmanager
def warming_up():
    """In this thread: every later tier is due at once and compiles in the
    calling thread (what ``Function.warmup`` runs under)."""
    before = getattr(_local, "warming", False)
    _local.warming = True
    try:
        yield
    finally:
        _local.warming = before


def submit(what, work):
    """A :class:`Job` running ``work()``: at once in the calling thread where
    :func:`in_call`, else queued for the worker thread.  ``what`` names it in
    messages."""
    job = Job(what, work)
    if in_call():
        job._run()
        return job
    with _lock:
        _queued.append(job)
    _ensure_worker()
    _queue.put(job)
    return job


def _ensure_worker():
    """Start the worker where this process has none (first use, or a forked child)."""
    global _queue, _worker, _worker_pid
    if _worker_pid == os.getpid():
        return
    with _lock:
        if _worker_pid == os.getpid():
            return
        _queue = queue.SimpleQueue()
        for job in _queued:  # a forked child's: the parent's worker is not here
            _queue.put(job)
        _worker = threading.Thread(target=_work, args=(_queue,), name="numbackend-compile",
                                   daemon=True)
        _worker.start()
        _worker_pid = os.getpid()


def _work(jobs):
    from jit_kernels import fork_gate  # not at import: numbackend loads jit_kernels lazily
    while True:
        job = jobs.get()
        fork_gate.enter()
        try:
            with _lock:
                if job not in _queued:  # run already (the parent's, in a forked child)
                    continue
            with _serving_threads_first():
                job._run()
            with _lock:
                _queued.remove(job)
        finally:
            fork_gate.leave()


@contextlib.contextmanager
def _serving_threads_first():
    """While the worker compiles: the GIL changes hands every
    tuning.COMPILE_SWITCH_INTERVAL_S at most, so that the calls going on in other
    threads wait little for it; the interval before is restored after, unless
    someone changed it meanwhile."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, tuning.COMPILE_SWITCH_INTERVAL_S))
    during = sys.getswitchinterval()  # as Python keeps it (whole microseconds)
    try:
        yield
    finally:
        if sys.getswitchinterval() == during:
            sys.setswitchinterval(before)


def _after_fork_in_child():
    # the parent's lock may have been held by its worker: this process's own
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
