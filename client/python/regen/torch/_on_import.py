# SPDX-License-Identifier: Apache-2.0
"""Run a function once a module has been imported: now if it is, else right
after its code ran (a finder on sys.meta_path that wraps its loader).

regen.torch registers its torch.compile backend with torch._dynamo and its
process group with torch.distributed this way: on torch 2.x importing
torch._dynamo takes seconds, which a rank that resumes from kept state
must not pay at `import regen.torch` when it never compiles.
"""

import importlib.abc
import sys
import threading
import warnings
from typing import Callable, Dict, List

__all__ = ["when_imported"]

_lock = threading.Lock()
_pending: Dict[str, List[Callable[[], None]]] = {}


def _run(name, callbacks):
    for callback in callbacks:
        try:
            callback()
        except Exception as e:   # the import the user asked for must not fail for ours
            warnings.warn(f"regen.torch: after importing {name}: {callback.__qualname__} failed: {e!r}")


class _Loader(importlib.abc.Loader):
    """The module's own loader, and the callbacks after its exec_module.
    The module is given its own loader back before its code runs, so
    nothing (inspect, linecache, importlib.resources) ever sees this one."""

    def __init__(self, loader, name):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
            _forget_finder_if_idle()
        _run(self._name, callbacks)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


_finder = _Finder()


def _forget_finder_if_idle():
    if not _pending and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def when_imported(name: str, callback: Callable[[], None]) -> None:
    """callback() once the module ``name`` has been imported: at once if it
    is in sys.modules, else just after its import ran its code (in the
    importing thread).  A callback that raises is a warning, not an error of
    the import."""
    with _lock:
        if name not in sys.modules:
            _pending.setdefault(name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    _run(name, [callback])
