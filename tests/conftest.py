import os
import tempfile

# One kernel cache for the whole session, unless the caller chose one (CI passes a cold one).
os.environ.setdefault("NUMBACKEND_CACHE_DIR", os.path.join(tempfile.gettempdir(), "numbackend-tests"))
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="numbackend-keras-home-"))
