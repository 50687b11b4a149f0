#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The wheel a PyTorch user installs with pip, and nothing else.

- `pip wheel .` builds it with meson-python (pyproject.toml; Debian 12:
  python3-mesonpy), offline, from a copy of the tree.
- It is tagged abi3 (regen._accel is built for the stable ABI) and holds
  libregen inside the package (regen/libregen.so.0, cJSON linked in: it
  needs no libcjson, and cJSON's MIT notice is regen/LICENSE.cJSON; the
  Apache-2.0 LICENSE is in its metadata), regen._accel, py.typed and every module of the
  package, and declares the command regen-nvrx-health.
- Installed alone into a fresh virtual environment (--no-deps, --no-index;
  the building Python's site-packages after its own, for torch alone),
  with nothing of this checkout or its build reachable: `import regen` does not import torch,
  regen finds the libregen inside itself and loads regen._accel, a call
  goes over libregen's ring to a host-backend regend, regen.torch's linear
  runs there on libregen's pool against torch's own, and rt.pool() serves a
  CUDA tensor where this machine has CUDA and torch.cuda.MemPool (else it
  says what it needs).

Usage: test_wheel.py REGEND SOURCE_DIR [--wheel WHEEL]

--wheel: a wheel built elsewhere (`pip wheel .` on a machine with
meson-python) is checked and installed instead of building one: the GPU
machine, which has torch and CUDA but no meson-python, runs the rest.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import TIME_SCALE, Regend, check, log, skip

# What runs inside the virtual environment: argv[1] is a host regend's
# socket, argv[2] the environment's site-packages, argv[3] a CUDA regend's
# socket where this machine has a GPU.
INSIDE = r'''
import os, sys
site = sys.argv[2]
import regen
assert regen.__file__.startswith(site), "regen from %s, not the wheel" % regen.__file__
assert "torch" not in sys.modules, "import regen imported torch"
from regen import accel, pool
lib = pool.find_libregen()
assert lib == os.path.join(site, "regen", "libregen.so.0"), "libregen from %r, not the wheel's" % lib
assert accel.ring() is not None, "the wheel's regen._accel did not load libregen"
st = regen.Client(sys.argv[1]).status()
assert st["devices"][0]["state"] == "ready", st
import torch
import regen.torch as rt
rt.configure(socket=sys.argv[1])
torch.manual_seed(7)
x = rt.host_empty([64, 96], torch.float32).copy_(torch.randn(64, 96))
w = rt.host_empty([48, 96], torch.float32).copy_(torch.randn(48, 96))
y = rt.linear(x, w)
err = (y.double() - x.double() @ w.double().t()).abs().max().item()
assert err < 1e-3, "rt.linear against float64: %g" % err
stats = rt.stats()
# On libregen's pool (no copy), through its ring (a doorbell rung).
assert stats["calls"] == 1 and stats["pool"]["chunks"] >= 1 and stats["host_copies"] == 0, stats
assert stats["doorbells"] >= 1, "the call did not take libregen's ring: %r" % stats
print("wheel: rt.linear in regend over libregen's ring on its host pool, error %.2e against float64" % err)
if len(sys.argv) > 3:
    rt.configure(socket=sys.argv[3])
    with rt.pool():
        a = torch.randn(256, 128, device="cuda")
    b = torch.randn(64, 128, device="cuda")
    got = rt.linear(a, b)
    err = (got.double() - a.double() @ b.double().t()).abs().max().item()
    assert err < 1e-2, "rt.linear on CUDA in rt.pool() memory: %g" % err
    assert rt.stats()["pool"]["chunks"] >= 1, rt.stats()
    print("wheel: rt.pool() served a CUDA tensor regend computed on, error %.2e" % err)
else:
    try:
        with rt.pool():
            pass
    except rt.NotSupported as e:
        print("wheel: rt.pool() here: %s" % e)
    except (AssertionError, RuntimeError) as e:
        print("wheel: rt.pool() here: no CUDA (%s)" % e)
'''


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600 * TIME_SCALE, **kw)
    check(r.returncode == 0, "%s failed (%d): %s%s" % (" ".join(argv), r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
    return r.stdout


def clean_env():
    """No pointer into this checkout or its build: what is installed must
    stand alone."""
    drop = ("REGEN_BUILD_ROOT", "REGEN_TEST_BUILD_ROOT", "REGEN_PY_ACCEL", "REGEN_LIBREGEN", "PYTHONPATH",
            "REGEN_REQUIRE_ACCEL", "REGEN_TRANSPORT")
    return {k: v for k, v in os.environ.items() if k not in drop}


def main():
    regend, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    prebuilt = os.path.abspath(sys.argv[sys.argv.index("--wheel") + 1]) if "--wheel" in sys.argv else None
    needs = "venv, ensurepip, pip" if prebuilt else "mesonpy, venv, ensurepip, pip"
    py = next((p for p in (shutil.which("python3"), "/usr/bin/python3", sys.executable)
               if p and subprocess.run([p, "-c", "import " + needs], capture_output=True).returncode == 0), None)
    if py is None:
        skip("no Python here has meson-python, venv and pip (Debian: python3-mesonpy, python3-venv, python3-pip; "
             "scripts/setup-debian installs them)")
    tmp = tempfile.mkdtemp(prefix="regen-wheel-")
    try:
        if prebuilt:
            wheel = prebuilt
        else:
            src = os.path.join(tmp, "src")
            shutil.copytree(source, src, symlinks=True,
                            ignore=shutil.ignore_patterns("build*", ".git", ".device", ".mesonpy*", "__pycache__",
                                                          "dist"))
            dist = os.path.join(tmp, "dist")
            run([py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist, src])
            wheels = glob.glob(os.path.join(dist, "regen-*.whl"))
            check(len(wheels) == 1, "pip wheel made %r" % wheels)
            wheel = wheels[0]
        tag = os.path.basename(wheel)[:-4].split("-")[-3:]
        check(tag[1] == "abi3" and tag[0].startswith("cp3") and tag[2].startswith("linux_"),
              "the wheel is tagged %s, not cpXY-abi3-linux_*" % "-".join(tag))
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            entry_points = next((z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
            z.extractall(os.path.join(tmp, "unpacked"))
        for need in ("regen/libregen.so.0", "regen/_accel.abi3.so", "regen/ops.py", "regen/py.typed",
                     "regen/nvrx.py"):
            check(need in names, "the wheel lacks %s" % need)
        check("regen-nvrx-health = regen.nvrx:main" in entry_points,
              "the wheel declares no regen-nvrx-health command: %r" % entry_points)
        check("[torch_dynamo_backends]" in entry_points and "regen = regen.torch._compile:backend" in entry_points,
              "the wheel declares no torch.compile backend \"regen\" (torch_dynamo_backends): %r" % entry_points)
        package = os.path.join(source, "client", "python", "regen")
        for root, _, files in os.walk(package):
            for name in files:
                if name.endswith(".py"):
                    rel = "regen/" + os.path.relpath(os.path.join(root, name), package)
                    check(rel in names, "the wheel left out %s" % rel)
        # The licences: regen's in the metadata, and cJSON's MIT notice
        # beside the libregen it is compiled into.
        def unpacked(name):
            with open(os.path.join(tmp, "unpacked", name)) as f:
                return f.read()
        licence = next((n for n in names if n.endswith(".dist-info/LICENSE")), None)
        check(licence and "Apache License" in unpacked(licence), "the wheel's metadata carries no Apache-2.0 LICENSE")
        check("regen/LICENSE.cJSON" in names and "Dave Gamble" in unpacked("regen/LICENSE.cJSON"),
              "the wheel's libregen has cJSON inside but the wheel lacks cJSON's MIT notice (regen/LICENSE.cJSON)")
        needed = run(["readelf", "-d", os.path.join(tmp, "unpacked", "regen", "libregen.so.0")])
        check("cjson" not in needed.lower(), "the wheel's libregen needs a libcjson of the machine: %s" % needed)
        log("pip wheel: %s (libregen with cJSON inside, regen._accel, py.typed)" % os.path.basename(wheel))

        venv = os.path.join(tmp, "venv")
        run([py, "-m", "venv", venv])
        vpy = os.path.join(venv, "bin", "python")
        # The building Python's site-packages after the environment's own,
        # for its torch alone (Debian's python3-torch, or a venv's): the
        # wheel, installed into the environment, comes first.
        theirs = run([py, "-c", "import site; print('\\n'.join(site.getsitepackages()))"])
        ours = run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
        with open(os.path.join(ours, "zz-building-python.pth"), "w") as f:
            f.write(theirs)
        run([vpy, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel])
        out = run([os.path.join(venv, "bin", "regen-nvrx-health"), "--help"], env=clean_env(), cwd=tmp)
        check("NVRx" in out, "regen-nvrx-health --help: %r" % out)
        site = run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).strip()
        env = clean_env()
        out = run([vpy, "-I", "-c", "import sys; sys.modules['torch'] = None; import regen; print(regen.__file__)"],
                  env=env, cwd=tmp)
        check(out.startswith(site), "regen came from %s" % out)
        r = subprocess.run([vpy, "-I", "-c", "import sys; sys.modules['torch'] = None; import regen.torch"],
                           capture_output=True, text=True, env=env, cwd=tmp)
        check(r.returncode != 0 and "regen.torch needs PyTorch" in r.stderr,
              "import regen.torch without torch: %d %s" % (r.returncode, r.stderr[-500:]))
        if subprocess.run([vpy, "-c", "import torch"], capture_output=True).returncode != 0:
            skip("the wheel built and installed; %s has no torch for the rest (Debian: python3-torch)" % py)
        # A GPU with torch.cuda.MemPool: rt.pool() against a CUDA regend too.
        gpu = subprocess.run([vpy, "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() and "
                              "hasattr(torch.cuda, 'MemPool') else 1)"], capture_output=True).returncode == 0
        script = os.path.join(tmp, "inside.py")
        with open(script, "w") as f:
            f.write(INSIDE)
        with Regend(regend, devices=1) as d:
            if gpu:
                with Regend(regend, devices=1, backend="cuda", ready_timeout=120) as g:
                    out = run([vpy, "-I", script, d.socket, site, g.socket], env=env, cwd=tmp)
            else:
                out = run([vpy, "-I", script, d.socket, site], env=env, cwd=tmp)
            for line in out.splitlines():
                log(line)
        log("pip install of the wheel alone: regen, libregen's ring and pool, regen.torch against a host regend")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
