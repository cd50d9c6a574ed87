"""Where libkeel.so and the keel command are: KEEL_LIBRARY and KEEL_BIN when set, else the
build folder of the checkout this package sits in (`make` builds both into build/)."""
import ctypes
import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(os.path.dirname(_PACKAGE))


def _build():
    return os.environ.get("KEEL_BUILD", os.path.join(_CHECKOUT, "build"))


def path():
    return os.environ.get("KEEL_LIBRARY", os.path.join(_build(), "lib", "libkeel.so"))


def command():
    """The keel command: $KEEL_BIN/keel, else build/bin/keel."""
    directory = os.environ.get("KEEL_BIN", os.path.join(_build(), "bin"))
    return os.path.join(directory, "keel")


def package_root():
    """The folder to put on PYTHONPATH so that `import keel` finds this package."""
    return os.path.dirname(_PACKAGE)


def load():
    library = path()
    if not os.path.exists(library):
        raise ImportError("keel: %s is missing: run `make` in %s (or set KEEL_LIBRARY)"
                          % (library, _CHECKOUT))
    return ctypes.CDLL(library)
