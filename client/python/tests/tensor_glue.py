# SPDX-License-Identifier: Apache-2.0
"""regen.torch's tensor glue (regen/torch/_tensors.py) for the tests that
drive regen.Client with stand-in tensors.  The glue imports no torch
itself; where torch is missing, regen.torch's __init__ (which needs torch)
cannot run, so the glue is loaded on its own, under its own name, where
regen.Client finds it (regen.objects.tensor_imports)."""

import importlib.util
import os
import sys

NAME = "regen.torch._tensors"


def load():
    if NAME in sys.modules:
        return sys.modules[NAME]
    try:
        return importlib.import_module(NAME)
    except ImportError:
        pass
    import regen
    spec = importlib.util.spec_from_file_location(NAME, os.path.join(os.path.dirname(regen.__file__), "torch",
                                                                     "_tensors.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module
