# SPDX-License-Identifier: Apache-2.0
"""The optional C encoder of regen.torch's chained calls (regen/_accel.c).

``module`` is the loaded extension, or None where there is none: the
client's Python encoder does the same work, a few µs slower per call.  It is
found, in order:

- at $REGEN_PY_ACCEL, a path to the built module (an error if it does not
  load: a test that names it must not pass on the Python path);
  REGEN_PY_ACCEL=none turns it off (to test or measure the Python path);
- as regen._accel beside this package (``meson install``, and
  ``pip install`` where a C compiler and Python's headers are there);
- as client/python/_accel.abi3.so under $REGEN_BUILD_ROOT (a build tree's,
  for the tests and benchmarks run from a checkout).
"""

import importlib.machinery
import importlib.util
import os

SUFFIX = "_accel.abi3.so"


def _from_file(path):
    loader = importlib.machinery.ExtensionFileLoader("regen._accel", path)
    spec = importlib.util.spec_from_file_location("regen._accel", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _load():
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


module = _load()
