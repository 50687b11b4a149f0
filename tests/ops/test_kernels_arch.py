#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GPUs regen's own kernels run on, as README's Platforms says.

The CUDA backend's module (what regen-cuda ships) carries, in every kernel
object of its .nv_fatbin section, machine code for each architecture from
sm_80 up that this toolkit's nvcc builds (`nvcc --list-gpu-code`) and the
PTX of the newest of them, nothing else; README names each of them. The
fat binaries are read here (ELF section, then the fatbin's entries), since
CI's toolkit has no cuobjdump.

Usage: test_kernels_arch.py MODULE NVCC README GPU_ARCH
GPU_ARCH: meson's -Dgpu_arch (a site's own list): skipped where set.
"""
import os
import re
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import check, log, skip

FATBIN_MAGIC = 0xBA55ED50
ENTRY_PTX, ENTRY_ELF = 1, 2


def elf_section(path, wanted):
    """The bytes of ELF64 little-endian section `wanted` of path, or None."""
    with open(path, "rb") as f:
        data = f.read()
    check(data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "%s is not a 64-bit little-endian ELF" % path)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, offset, size

    _, names_at, _ = header(shstrndx)
    for i in range(shnum):
        name, offset, size = header(i)
        end = data.index(b"\0", names_at + name)
        if data[names_at + name:end].decode() == wanted:
            return data[offset:offset + size]
    return None


def fatbins(section):
    """Each fat binary of the section (one per kernel object linked in) as a
    list of (kind, architecture) entries."""
    out, at = [], 0
    while at + 16 <= len(section):
        magic, _version, header_size, size = struct.unpack_from("<IHHQ", section, at)
        if magic != FATBIN_MAGIC:
            # Objects' fat binaries are aligned: skip the padding.
            at += 8
            continue
        entries, p, end = [], at + header_size, at + header_size + size
        while p < end:
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", section, p)
            arch, = struct.unpack_from("<I", section, p + 28)
            entries.append((kind, arch))
            p += entry_header + entry_size
        out.append(entries)
        at = end
    return out


def main():
    module, nvcc, readme, gpu_arch = sys.argv[1:5]
    if gpu_arch.strip():
        skip("built with -Dgpu_arch=%s: the site's own list" % gpu_arch)
    listed = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout.split()
    wanted = sorted(int(c[3:]) for c in listed if re.fullmatch(r"sm_\d+", c) and int(c[3:]) >= 80)
    check(wanted, "%s --list-gpu-code lists nothing from sm_80 up: %s" % (nvcc, listed))
    newest = max(wanted)

    section = elf_section(module, ".nv_fatbin")
    check(section, "%s has no .nv_fatbin section: no kernels linked in" % module)
    objects = fatbins(section)
    check(objects, "%s's .nv_fatbin holds no fat binary" % module)
    for i, entries in enumerate(objects):
        elf = sorted(a for k, a in entries if k == ENTRY_ELF)
        ptx = sorted(a for k, a in entries if k == ENTRY_PTX)
        check(elf == wanted, "kernel object %d of %s: machine code for sm_%s, wanted sm_%s (nvcc --list-gpu-code)" %
              (i, module, elf, wanted))
        check(ptx == [newest], "kernel object %d of %s: PTX for compute_%s, wanted compute_%d alone" %
              (i, module, ptx, newest))
    log("%d kernel objects, each sm_%s and PTX compute_%d" % (len(objects), " sm_".join(map(str, wanted)), newest))

    with open(readme, encoding="utf-8") as f:
        platforms = f.read().split("\n## Platforms", 1)[1].split("\n## ", 1)[0]
    missing = [n for n in ["sm_%d" % a for a in wanted] + ["compute_%d" % newest]
               if not re.search(r"\b%s\b" % n, platforms)]
    check(not missing, "README's Platforms does not name %s, which the kernels are built for" % missing)
    log("README's Platforms names each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
