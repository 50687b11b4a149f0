#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python package is typed: PEP 561's marker (regen/py.typed), type
hints on every parameter and result of its public API, and mypy finds no
error in it.

The public API: what `regen` and `regen.torch` export (their __all__) and
the public methods of the classes among them (regen.Client's every part),
regen.torch.nn's layers, regen.torch.optim.AdamW.  Left out, by name:
exceptions (their constructor is Error's, typed), regen.torch.Runtime (the
runtime's internals, reached through the module's functions) and
regen.torch.explain (the compile backend's, typed with it).

mypy runs with pyproject.toml's [tool.mypy] under the first of python3
and /usr/bin/python3 that imports torch (Debian's python3-torch), so
regen.torch is checked against torch's own types; skipped (77) where mypy
is not installed (Debian: mypy).

Usage: test_typing.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import check, log, skip

# Run under the Python that has torch: lists what lacks a hint, one a line.
UNTYPED = r'''
import inspect, sys
import regen

LEFT_OUT = {"Runtime", "explain"}


def lacking(where, fn):
    out = []
    if isinstance(fn, property):
        fn = fn.fget
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return out
    for i, (name, p) in enumerate(sig.parameters.items()):
        if i == 0 and name in ("self", "cls"):
            continue
        if p.annotation is inspect.Parameter.empty:
            out.append(f"{where}: parameter {name}")
    if sig.return_annotation is inspect.Signature.empty:
        out.append(f"{where}: result")
    return out


def of_class(prefix, cls):
    out = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("regen"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") and name != "__init__":
                continue
            if callable(member) or isinstance(member, (property, staticmethod, classmethod)):
                out += lacking(f"{prefix}.{name} ({klass.__module__})", member)
    return out


def of_module(mod, names):
    out = []
    for name in names:
        if name in LEFT_OUT:
            continue
        obj = getattr(mod, name)
        if isinstance(obj, type):
            if not issubclass(obj, BaseException):
                out += of_class(f"{mod.__name__}.{name}", obj)
        elif callable(obj) and not isinstance(obj, type(sys)):
            out += lacking(f"{mod.__name__}.{name}", obj)
    return out


missing = of_module(regen, regen.__all__)
checked = len(regen.__all__)
try:
    import torch  # noqa: F401
except ImportError:
    torch = None
if torch is not None:
    import regen.torch as rt
    missing += of_module(rt, rt.__all__)
    missing += of_module(rt.nn, rt.nn.__all__)
    missing += of_class("regen.torch.optim.AdamW", rt.optim.AdamW)
    checked += len(rt.__all__) + len(rt.nn.__all__) + 1
for line in missing:
    print(line)
print(f"checked {checked} names{'' if torch is not None else ' (no torch: regen.torch left out)'}", file=sys.stderr)
'''


def torch_python():
    for candidate in (shutil.which("python3"), "/usr/bin/python3"):
        if candidate and subprocess.run([candidate, "-c", "import torch"], capture_output=True).returncode == 0:
            return candidate
    return sys.executable


def main():
    source = os.path.abspath(sys.argv[1])
    package = os.path.join(source, "client", "python")
    check(os.path.isfile(os.path.join(package, "regen", "py.typed")), "regen/py.typed is missing (PEP 561)")
    py = torch_python()
    env = dict(os.environ, PYTHONPATH=package)
    r = subprocess.run([py, "-c", UNTYPED], capture_output=True, text=True, env=env, timeout=300)
    check(r.returncode == 0, "listing the public API failed: %s" % r.stderr[-3000:])
    check(not r.stdout.strip(), "public API without type hints:\n" + r.stdout)
    log("every public function and method is typed (%s, %s)" % (py, r.stderr.strip().splitlines()[-1]))
    mypy = shutil.which("mypy")
    if mypy is None:
        skip("mypy is not installed (Debian: mypy): the hints were checked, not mypy")
    r = subprocess.run([mypy, "--config-file", os.path.join(source, "pyproject.toml"), "--python-executable", py,
                        "--no-incremental", "regen"], capture_output=True, text=True, cwd=package, timeout=600)
    check(r.returncode == 0, "mypy found errors:\n%s%s" % (r.stdout[-6000:], r.stderr[-2000:]))
    log("mypy under %s: %s" % (py, r.stdout.strip().splitlines()[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
