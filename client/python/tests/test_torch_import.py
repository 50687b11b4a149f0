# SPDX-License-Identifier: Apache-2.0
"""`import regen.torch` is cheap: it imports neither torch._dynamo (seconds
on torch 2.x) nor regen's compile backend, and still torch.compile finds
backend "regen" and torch.distributed backend "regen" once torch imports
them (regen.torch._on_import).  Under a torch without dynamo (Debian's
1.13) a stand-in torch._dynamo with torch 2.x's registry shows the hook;
under a torch with dynamo, torch's own registry does."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

try:
    import torch
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)

HAVE_DYNAMO = torch is not None and importlib.util.find_spec("torch._dynamo") is not None

# torch 2.x's registry, as torch/_dynamo/backends/registry.py has it (names
# to EntryPoint or None; loaded compiler functions; a duplicate asserts).
FAKE_REGISTRY = '''
_BACKENDS = {}
_COMPILER_FNS = {}

def register_backend(compiler_fn=None, name=None, tags=()):
    name = name or compiler_fn.__name__
    assert name not in _COMPILER_FNS, f"duplicate name: {name}"
    _BACKENDS.setdefault(name, None)
    _COMPILER_FNS[name] = compiler_fn
    return compiler_fn

def lookup_backend(name):
    if name not in _COMPILER_FNS:
        entry_point = _BACKENDS[name]
        register_backend(compiler_fn=entry_point.load(), name=name)
    return _COMPILER_FNS[name]
'''

FAKE_DYNAMO = '''
from .backends.registry import lookup_backend, register_backend

def disable(fn):
    def disabled(*args, **kwargs):
        return fn(*args, **kwargs)
    disabled.dynamo_disabled = fn
    return disabled
'''


def run_python(code, fake_dynamo=None):
    prelude = ""
    if fake_dynamo is not None:
        prelude = f"import torch\ntorch.__path__.append({fake_dynamo!r})\n"
    env = dict(os.environ, PYTHONPATH=PKG)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=120)


@unittest.skipIf(torch is None, "no torch under this Python")
class Import(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.fake = os.path.join(self.tmp.name, "fake")
        os.makedirs(os.path.join(self.fake, "_dynamo", "backends"))
        for path, text in (("_dynamo/__init__.py", FAKE_DYNAMO), ("_dynamo/backends/__init__.py", ""),
                           ("_dynamo/backends/registry.py", FAKE_REGISTRY)):
            with open(os.path.join(self.fake, path), "w") as f:
                f.write(text)

    def check(self, r, lines):
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), lines, r.stderr)

    def test_imports_neither_dynamo_nor_the_backend(self):
        r = run_python("""
            import sys, torch, regen.torch as rt
            print("torch._dynamo" in sys.modules, "regen.torch._compile" in sys.modules,
                  "regen.lowering" in sys.modules)
            print(callable(rt.explain), "regen.torch._compile" in sys.modules)
        """)
        self.check(r, ["False", "False", "False", "True", "True"])

    def test_process_group_registered_once_torch_distributed_is(self):
        if not torch.distributed.is_available():
            self.skipTest("this torch has no torch.distributed")
        r = run_python("""
            import torch, regen.torch as rt
            import torch.distributed as dist
            print("REGEN" in getattr(dist.Backend, "_plugins", {"REGEN": 1}), rt.ProcessGroupRegen.__name__)
        """)
        self.check(r, ["True", "ProcessGroupRegen"])

    @unittest.skipIf(HAVE_DYNAMO, "this torch has torch._dynamo: test_torch_compile_finds_regen runs instead")
    def test_dynamo_imported_after_regen_torch(self):
        r = run_python("""
            import sys, regen.torch as rt, regen.torch._on_import as on_import
            print(any(isinstance(f, on_import._Finder) for f in sys.meta_path))
            import torch._dynamo
            from torch._dynamo.backends import registry
            from regen.torch import _compile, fp8
            print(registry._COMPILER_FNS.get("regen") is _compile.backend, registry.lookup_backend("regen") is
                  _compile.backend)
            # fp8's forward is kept out of graphs, the module keeps its own loader,
            # and the finder is gone once nothing waits.
            print(getattr(fp8._forward, "dynamo_disabled", None) is not None,
                  type(torch._dynamo.__loader__).__name__ == "SourceFileLoader",
                  any(isinstance(f, on_import._Finder) for f in sys.meta_path))
        """, self.fake)
        self.check(r, ["True", "True", "True", "True", "True", "False"])

    @unittest.skipIf(HAVE_DYNAMO, "this torch has torch._dynamo: test_torch_compile_finds_regen runs instead")
    def test_dynamo_imported_before_regen_torch(self):
        r = run_python("""
            import torch._dynamo, regen.torch
            from torch._dynamo.backends import registry
            from regen.torch import _compile, fp8
            print(registry.lookup_backend("regen") is _compile.backend,
                  getattr(fp8._forward, "dynamo_disabled", None) is not None)
        """, self.fake)
        self.check(r, ["True", "True"])

    @unittest.skipIf(HAVE_DYNAMO, "this torch has torch._dynamo: test_torch_compile_finds_regen runs instead")
    def test_wheel_entry_point_loaded_by_torch(self):
        # An installed wheel: torch found "regen" in the entry points
        # (an EntryPoint in _BACKENDS) and loads it on lookup, which imports
        # regen.torch, whose own registration must leave it to torch.
        r = run_python("""
            import importlib.metadata, torch._dynamo
            from torch._dynamo.backends import registry
            registry._BACKENDS["regen"] = importlib.metadata.EntryPoint(
                "regen", "regen.torch._compile:backend", "torch_dynamo_backends")
            fn = registry.lookup_backend("regen")
            import regen.torch._compile as c
            print(fn is c.backend)
        """, self.fake)
        self.check(r, ["True"])

    @unittest.skipUnless(HAVE_DYNAMO, "this torch has no torch._dynamo (torch < 2.0)")
    def test_torch_compile_finds_regen(self):
        r = run_python("""
            import sys, torch, regen.torch
            print("torch._dynamo" in sys.modules)
            import torch._dynamo
            from torch._dynamo.backends.registry import lookup_backend
            from regen.torch import _compile
            print(lookup_backend("regen") is _compile.backend)
            torch.compile(torch.nn.Linear(2, 2), backend="regen")
            print("ok")
        """)
        self.check(r, ["False", "True", "ok"])

    def test_when_imported(self):
        mod = os.path.join(self.tmp.name, "mods")
        os.makedirs(mod)
        with open(os.path.join(mod, "late_module.py"), "w") as f:
            f.write("VALUE = 7\n")
        r = run_python(f"""
            import sys
            sys.path.insert(0, {mod!r})
            from regen.torch._on_import import when_imported
            seen = []
            when_imported("late_module", lambda: seen.append(sys.modules["late_module"].VALUE))
            when_imported("late_module", lambda: 1 / 0)     # a warning, not the import's error
            print(seen)
            import late_module
            print(seen, type(late_module.__loader__).__name__)
            when_imported("late_module", lambda: seen.append("now"))
            print(seen[-1])
        """)
        self.check(r, ["[]", "[7]", "SourceFileLoader", "now"])
        self.assertIn("ZeroDivisionError", r.stderr)


if __name__ == "__main__":
    unittest.main()
