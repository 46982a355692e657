"""Where numbackend's compiled code and kernels are cached: the cache roots (see
jit_kernels.compiling's docstring), the folders that may be written or read as
seeds, and atomic writes.  Imports nothing of Numba or NumPy: a process that
serves a model from a native entry (numbackend/native.py) finds it here
without loading Numba."""
import contextlib as _contextlib
import os as _os
import stat as _stat
import tempfile as _tempfile
import warnings as _warnings


def _configured_root():
    """NUMBACKEND_CACHE_DIR, or None where it is not set."""
    return _os.environ.get("NUMBACKEND_CACHE_DIR") or None


def _user_root():
    """The user's cache folder for numbackend (XDG_CACHE_HOME, else ~/.cache)."""
    home = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(home, "numbackend")


def seed_dir():
    """The package's own seed: a cache root inside the installed package, always
    searched (read-only) for compiled code, and where ``python -m numbackend
    warmup`` saves (see :func:`saving_to`) when the install can be written."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_seed")


def seed_roots():
    """The read-only cache roots searched before the writable one, in order: each
    folder of NUMBACKEND_CACHE_SEED (separated by os.pathsep), the package's
    :func:`seed_dir` (unless NUMBACKEND_PACKAGE_SEED is 0: a measurement of cold
    compiles), and NUMBACKEND_CACHE_DIR (read where it cannot be written: a seed
    shipped in an image)."""
    roots = [r for r in _os.environ.get("NUMBACKEND_CACHE_SEED", "").split(_os.pathsep) if r]
    if _os.environ.get("NUMBACKEND_PACKAGE_SEED", "1") != "0":
        roots.append(seed_dir())
    if _configured_root():
        roots.append(_configured_root())
    return roots


_save_root = None  # the cache root of saving_to, where set


def configuration():
    """What the folders of :func:`usable_folder` and :func:`seed_folders` depend
    on, as a tuple: a change of it may change them."""
    return (_save_root, _configured_root(), _user_root(), _tempfile.gettempdir(),
            _os.environ.get("NUMBACKEND_CACHE_SEED"), _os.environ.get("NUMBACKEND_PACKAGE_SEED"))


@_contextlib.contextmanager
def saving_to(root):
    """Save compiled code and generated kernels under the cache root ``root`` in
    the ``with`` block, process-wide (``python -m numbackend warmup`` builds a
    seed with it).  Raises OSError, before the block, where ``root`` cannot be
    used (see :func:`usable_folder`)."""
    global _save_root
    previous, _save_root = _save_root, root
    try:
        reason = _unusable(root, (), follow_link=True)
        if reason is not None:
            raise OSError(f"saving_to: cannot save compiled code under {root} ({reason})")
        yield root
    finally:
        _save_root = previous


def entry_mode():
    """The permissions of a new cache file: readable by all when saving to a
    seed (:func:`saving_to`: it serves other users), else by this user alone."""
    return 0o644 if _save_root is not None else 0o600


def usable_folder(*names):
    """``<cache root>/<names...>``, made where missing, for saving: under the root
    of :func:`saving_to`, else NUMBACKEND_CACHE_DIR, else the user's cache
    folder, else ``<tmp>/numbackend-<uid>``, else a fresh folder of this
    process (deleted when it exits).

    A folder is used only where this process can write and no one else can
    (see :func:`_unusable`): Numba loads the pickles it finds there.  A
    configured folder that cannot be used (read-only: it is then read as a
    seed), and a temporary one made by someone else, are named in a warning,
    once.  Raises OSError when no folder can be made at all."""
    if _save_root is not None:
        reason = _unusable(_save_root, names, follow_link=True)
        if reason is not None:
            raise OSError(f"usable_folder: cannot save under {_save_root} ({reason})")
        return _os.path.join(_save_root, *names)
    configured = _configured_root()
    # a configured folder or ~/.cache/numbackend may be a link the user made;
    # the fixed name in the world-writable temporary folder may not
    base = configured or _user_root()
    reason = _unusable(base, names, follow_link=True)
    if reason is None:
        return _os.path.join(base, *names)
    if configured:
        warn_once(configured, f"numbackend: the kernel cache folder {configured} cannot be used "
                               f"for saving ({reason}); saving to a temporary folder, reading it as a seed")
    temporary = _os.path.join(_tempfile.gettempdir(), f"numbackend-{_os.getuid()}")
    reason = _unusable(temporary, names, follow_link=False)
    if reason is None:
        return _os.path.join(temporary, *names)
    warn_once(temporary, f"numbackend: the kernel cache folder {temporary} cannot be used "
                          f"({reason}); using a new folder of this process")
    global _private_base
    if _private_base is None or _unusable(_private_base, names, follow_link=False) is not None:
        import atexit
        import shutil
        _private_base = _tempfile.mkdtemp(prefix="numbackend-")  # mode 0700
        atexit.register(shutil.rmtree, _private_base, ignore_errors=True)
        reason = _unusable(_private_base, names, follow_link=False)
        if reason is not None:
            raise OSError(f"numbackend: no usable kernel cache folder ({reason}); "
                          "set NUMBACKEND_CACHE_DIR")
    return _os.path.join(_private_base, *names)


_private_base = None  # the fresh folder of this process, once made


def _unusable(base, names, follow_link):
    """Why ``base/names...`` cannot take cache entries, after making the folders
    that are missing (mode 0700, or 0755 for a seed: see :func:`entry_mode`);
    None when it can.

    Whoever can write to the folder, or to one above it up to ``base`` (where
    they can rename it and put their own in its place), can run code in this
    process: each must be a folder owned by this user that group and others
    cannot write to, and ``base`` a link only if ``follow_link``.  The folder
    must take a file."""
    paths = [base]
    for name in names:
        paths.append(_os.path.join(paths[-1], name))
    try:
        for path in paths:
            if not _os.path.lexists(path):
                if _save_root is None:
                    _os.makedirs(path, mode=0o700, exist_ok=True)
                else:  # a seed, in a folder its user chose: readable by all, whatever the umask
                    _os.makedirs(path, mode=0o755, exist_ok=True)
                    _os.chmod(path, 0o755)
            status = _os.stat(path, follow_symlinks=follow_link and path == base)
            if _stat.S_ISLNK(status.st_mode):
                return f"{path} is a symbolic link"
            if not _stat.S_ISDIR(status.st_mode):
                return f"{path} is not a folder"
            if status.st_uid != _os.getuid():
                return f"{path} is owned by user {status.st_uid}"
            if status.st_mode & (_stat.S_IWGRP | _stat.S_IWOTH):
                return f"others can write to {path}"
        _tempfile.TemporaryFile(dir=paths[-1]).close()
    except OSError as error:
        return str(error)
    return None


def seed_folders(*names):
    """The existing ``<seed root>/<names...>`` folders of :func:`seed_roots` that
    can be trusted: every folder from the root down owned by this user or by
    root, and writable by neither group nor others (whoever can write there
    can run code in this process).  A seed that fails is named in a warning,
    once, and skipped."""
    folders = []
    for root in seed_roots():
        folder = _os.path.join(root, *names)
        try:
            found = _os.path.isdir(folder) and _os.access(folder, _os.R_OK | _os.X_OK)
        except OSError:
            found = False
        if not found:
            if _os.path.isdir(root) and not _os.access(root, _os.R_OK | _os.X_OK):
                warn_once(("seed", root), f"numbackend: the cache seed {root} cannot be read "
                                           "by this user")
            continue
        if folder in folders:
            continue
        reason = _untrusted(root, names)
        if reason is None:
            folders.append(folder)
        else:
            warn_once(("seed", root), f"numbackend: the cache seed {root} is not read ({reason})")
    return folders


def _untrusted(root, names):
    """Why the seed folder ``root/names...`` cannot be trusted, or None."""
    path = root
    for name in (None, *names):
        if name is not None:
            path = _os.path.join(path, name)
        status = _os.stat(path, follow_symlinks=name is None)
        if _stat.S_ISLNK(status.st_mode):
            return f"{path} is a symbolic link"
        if status.st_uid not in (0, _os.getuid()):
            return f"{path} is owned by user {status.st_uid}"
        if status.st_mode & (_stat.S_IWGRP | _stat.S_IWOTH):
            return f"others can write to {path}"
    return None


_warned = set()  # the folders warned of


def warn_once(folder, message):
    """warnings.warn(message), where nothing was said yet of ``folder`` (None: of
    having no cache folder at all) in this process."""
    if folder not in _warned:
        _warned.add(folder)
        _warnings.warn(message, stacklevel=3)


def write_atomically(path, data):
    """Write the bytes ``data`` to ``path`` through a new temporary file in its
    folder, renamed over it: a concurrent reader sees the whole file or none,
    concurrent writers (threads or processes) each have their own temporary
    file, and a failure leaves none."""
    descriptor, temporary = _tempfile.mkstemp(dir=_os.path.dirname(path),
                                              prefix=f"{_os.path.basename(path)}.", suffix=".tmp")
    try:
        _os.fchmod(descriptor, entry_mode())
        with open(descriptor, "wb") as f:
            f.write(data)
        _os.replace(temporary, path)
    except BaseException:
        with _contextlib.suppress(OSError):
            _os.remove(temporary)
        raise
