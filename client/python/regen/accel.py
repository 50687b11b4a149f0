# SPDX-License-Identifier: Apache-2.0
"""regen._accel (regen/_accel.c), the binding that puts the Python client's
lanes on libregen's ring, and the libregen it drives.

``module`` is the extension, or None where there is none; ``ring()`` is
the extension with libregen loaded into it, or None where either is
missing: the client then speaks Varlink alone.  The extension is found, in
order:

- at $REGEN_PY_ACCEL, a path to the built module (an error if it does not
  load: a test that names it must not pass on Varlink);
  REGEN_PY_ACCEL=none turns it off (to test or measure the Varlink path);
- as regen._accel beside this package (``meson install``, the wheel,
  Debian's python3-regen);
- as client/python/_accel.abi3.so under $REGEN_BUILD_ROOT (a build tree's,
  for the tests and benchmarks run from a checkout).

libregen is the one regen.pool loads (regen.pool.find_libregen): the pool
and the lanes share it.
"""

import importlib.machinery
import importlib.util
import os

from .pool import find_libregen

SUFFIX = "_accel.abi3.so"


def _from_file(path):
    loader = importlib.machinery.ExtensionFileLoader("regen._accel", path)
    spec = importlib.util.spec_from_file_location("regen._accel", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _extension():
    given = os.environ.get("REGEN_PY_ACCEL")
    if given == "none":
        return None
    if given:
        try:
            return _from_file(given)
        except (ImportError, OSError) as e:
            raise ImportError(f"REGEN_PY_ACCEL={given}: {e}") from e
    try:
        from . import _accel
        return _accel
    except ImportError:
        pass
    root = os.environ.get("REGEN_BUILD_ROOT")
    if root:
        path = os.path.join(root, "client", "python", SUFFIX)
        if os.path.exists(path):
            try:
                return _from_file(path)
            except (ImportError, OSError):
                return None
    return None


def _load_libregen():
    if module is None:
        return None
    path = find_libregen()
    if path is None:
        return None
    try:
        module.load(path)
    except ImportError:
        if os.environ.get("REGEN_PY_ACCEL") not in (None, "", "none"):
            raise
        return None
    return module


module = _extension()
_ring = None


def ring():
    """The extension with libregen loaded (on first use), or None."""
    global _ring
    if _ring is None:
        _ring = _load_libregen() or False
    return _ring or None
