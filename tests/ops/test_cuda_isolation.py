#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Only a CUDA worker maps the CUDA libraries.

The CUDA backend is a module (backend-cuda.so) that a worker loads when its
backend is cuda; regend itself links no CUDA library. So, in a build with
the CUDA backend:

1. regend's ELF dynamic section lists no libcudart, libcublas(Lt), libcuda
   or libcudnn as NEEDED, while the module's lists libcudart (which also
   shows that the parser below finds NEEDED entries at all).
2. With the host backend, neither the supervisor nor its worker has any of
   those libraries mapped (/proc/PID/maps).
3. A worker whose module cannot be loaded logs a line naming the file and
   exits with status 4 (unsupported: test_unsupported.py holds what Status
   says); the supervisor stays up and answers Status.

Skipped (77) where the build has no CUDA backend.

Usage: test_cuda_isolation.py REGEND MODULE|none
"""
import os
import re
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Regend, check, fail, log, pid_alive, regend_path, skip, try_status, wait_for

CUDA_LIBS = re.compile(r"lib(cudart|cublas|cublasLt|cuda|cudnn)[._-]")
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB = 0, 1, 5


def elf_needed(path):
    """The DT_NEEDED names of a 64-bit little-endian ELF file, read through
    its program headers (what the dynamic loader reads)."""
    with open(path, "rb") as f:
        data = f.read()
    check(data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "%s is not a 64-bit little-endian ELF" % path)
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    check(dynamic is not None, "%s has no dynamic section" % path)

    def file_offset(vaddr):
        for base, off, size in loads:
            if base <= vaddr < base + size:
                return off + vaddr - base
        fail("%s: address %#x is in no loaded segment" % (path, vaddr))

    needed, strtab = [], None
    off, size = dynamic
    for pos in range(off, off + size, 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            needed.append(val)
        elif tag == DT_STRTAB:
            strtab = file_offset(val)
    check(strtab is not None, "%s has no DT_STRTAB" % path)
    return [data[strtab + n:data.index(b"\0", strtab + n)].decode() for n in needed]


def cuda_maps(pid):
    with open("/proc/%d/maps" % pid) as f:
        return sorted({line.split()[-1] for line in f if CUDA_LIBS.search(os.path.basename(line.split()[-1]))})


def check_elf(regend, module):
    needed = elf_needed(regend)
    log("regend NEEDED:", " ".join(needed))
    check(needed, "found no NEEDED entry in %s" % regend)
    bad = [n for n in needed if CUDA_LIBS.search(n)]
    check(not bad, "regend links CUDA libraries: %s" % bad)
    mod_needed = elf_needed(module)
    log("module NEEDED:", " ".join(mod_needed))
    check(any(n.startswith("libcudart") for n in mod_needed),
          "the CUDA module %s does not list libcudart: %s" % (module, mod_needed))


def check_host_maps(regend):
    with Regend(regend, devices=1, fault_injection=False) as daemon:
        status = daemon.wait_ready()
        worker = int(status["devices"][0]["worker_pid"])
        check(worker > 0 and worker != daemon.pid, "no worker pid in Status: %r" % status)
        for role, pid in (("supervisor", daemon.pid), ("worker", worker)):
            libs = cuda_maps(pid)
            log("%s %d maps %d CUDA libraries" % (role, pid, len(libs)))
            check(not libs, "the %s (pid %d) maps CUDA libraries: %s" % (role, pid, libs))


def check_failed_load(regend):
    with Regend(regend, devices=1, backend="cuda", fault_injection=False, start=False) as daemon:
        empty = os.path.join(daemon.dir, "modules")
        os.mkdir(empty)
        daemon.start(wait=False, env={"REGEN_BACKEND_DIR": empty})
        want = "the CUDA backend is not installed: no backend-cuda.so in %s" % empty
        wait_for(lambda: want in daemon.log_text() and "worker exited: the node's software cannot drive" in
                 daemon.log_text(), 30, "the worker to log '%s' and exit with status 4" % want)
        check(pid_alive(daemon.pid), "the supervisor died with its worker")
        status = wait_for(lambda: try_status(daemon.socket), 10, "the supervisor to answer Status")
        check(status["devices"][0]["state"] != "ready", "a device without its backend is ready: %r" % status)


def main():
    regend = regend_path()
    module = sys.argv[2] if len(sys.argv) > 2 else "none"
    if module == "none":
        skip("this build has no CUDA backend")
    check(os.path.exists(module), "the CUDA module %s was not built" % module)
    check_elf(regend, os.path.abspath(module))
    check_host_maps(regend)
    check_failed_load(regend)
    log("PASS")


if __name__ == "__main__":
    main()
