# SPDX-License-Identifier: Apache-2.0
"""Host-backend tensors: a memfd holding one tensor, with its values
readable and writable from Python (stdlib only), for tests, demos and
benchmarks against ``regend --backend host``."""

import array
import errno
import math
import os
import random
import struct

from .client import DTYPE_SIZE, Operand
from .reference import fp8_decode, fp8_encode

__all__ = ["HostTensor", "pack", "unpack", "random_values"]


def _bf16_bits(u32):
    # Round to nearest even, as every bf16 converter does; NaN stays NaN.
    if (u32 & 0x7F800000) == 0x7F800000 and (u32 & 0x007FFFFF):
        return (u32 >> 16) | 0x40
    return ((u32 + 0x7FFF + ((u32 >> 16) & 1)) >> 16) & 0xFFFF


def _f16_rounded(value):
    # struct refuses what rounds past f16's largest, 65504 (from 65520 on,
    # the tie rounding to even, up): IEEE rounding makes it an infinity of
    # its sign, and so does torch's .half().
    value = float(value)
    return math.copysign(math.inf, value) if abs(value) >= 65520.0 else value


def pack(dtype, values):
    """Bytes of ``values`` (floats; integers for "i32", "i64" and "u8") as
    ``dtype`` ("f32", "f16", "bf16", "f64", "i32", "i64", "u8", "e4m3",
    "e5m2"), each rounded to nearest even, a float past the type's range
    becoming an infinity of its sign (as torch converts; FP8 saturates to its
    largest value instead, as torch's float8 training casts do)."""
    if dtype == "f32":
        return array.array("f", values).tobytes()
    if dtype == "f64":
        return array.array("d", values).tobytes()
    if dtype == "i32":
        return array.array("i", [int(x) for x in values]).tobytes()
    if dtype == "i64":
        return array.array("q", [int(x) for x in values]).tobytes()
    if dtype == "u8":
        return bytes(int(x) for x in values)
    if dtype in ("e4m3", "e5m2"):
        return bytes(fp8_encode(dtype, float(x)) for x in values)
    if dtype == "f16":
        try:
            return struct.pack(f"<{len(values)}e", *values)
        except OverflowError:
            return struct.pack(f"<{len(values)}e", *[_f16_rounded(v) for v in values])
    if dtype == "bf16":
        words = array.array("I", array.array("f", values).tobytes())
        return array.array("H", [_bf16_bits(w) for w in words]).tobytes()
    raise ValueError(f"unknown dtype {dtype!r}")


def unpack(dtype, data):
    """Floats (integers for "i32", "i64" and "u8") from bytes of ``dtype``."""
    if dtype == "f32":
        return array.array("f", data).tolist()
    if dtype == "f64":
        return array.array("d", data).tolist()
    if dtype == "i32":
        return array.array("i", data).tolist()
    if dtype == "i64":
        return array.array("q", data).tolist()
    if dtype == "u8":
        return list(data)
    if dtype in ("e4m3", "e5m2"):
        return [fp8_decode(dtype, b) for b in data]
    if dtype == "f16":
        return list(struct.unpack(f"<{len(data) // 2}e", data))
    if dtype == "bf16":
        halves = array.array("H", data)
        return array.array("f", array.array("I", [h << 16 for h in halves]).tobytes()).tolist()
    raise ValueError(f"unknown dtype {dtype!r}")


def _pwrite_all(fd, data, offset):
    """Writes all of ``data`` at ``offset``: a write may move less than it
    was given (Linux moves at most 2 GiB less a page in one), and goes on
    from there."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n == 0:
            raise OSError(errno.EIO, f"a write at byte {offset + done} of fd {fd} moved nothing")
        done += n


def _pread_all(fd, size, offset):
    """``size`` bytes read at ``offset``, by as many reads as it takes (one
    moves at most 2 GiB less a page); a file that ends first raises."""
    buf = bytearray(size)
    view = memoryview(buf)
    done = 0
    while done < size:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise EOFError(f"fd {fd} ends at byte {offset + done}, before the {size} bytes asked for")
        done += n
    return buf


def random_values(n, rng=None, lo=-1.0, hi=1.0):
    rng = rng or random.Random()
    return [rng.uniform(lo, hi) for _ in range(n)]


class HostTensor:
    """A contiguous row-major tensor in its own memfd.

    ``t.write(values)`` / ``t.read()`` move flat lists of floats;
    ``t.import_into(client, device)`` shares it with regend, after which
    ``t.op`` is its Operand."""

    def __init__(self, shape, dtype="f32", name="regen-tensor"):
        if dtype not in DTYPE_SIZE:
            raise ValueError(f"unknown dtype {dtype!r}")
        self.shape = [int(s) for s in shape]
        self.dtype = dtype
        self.numel = 1
        for s in self.shape:
            self.numel *= s
        self.nbytes = self.numel * DTYPE_SIZE[dtype]
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, max(self.nbytes, 1))
        self.buffer = None

    @classmethod
    def random(cls, shape, dtype="f32", rng=None, name="regen-tensor"):
        t = cls(shape, dtype, name)
        t.write(random_values(t.numel, rng))
        return t

    def write(self, values):
        if len(values) != self.numel:
            raise ValueError(f"{len(values)} values for a tensor of {self.numel}")
        _pwrite_all(self.fd, pack(self.dtype, values), 0)

    def read(self):
        return unpack(self.dtype, _pread_all(self.fd, self.nbytes, 0))

    def import_into(self, client, device=0):
        self.buffer = client.import_memfd(device, self.fd, self.nbytes)
        return self.buffer

    @property
    def op(self):
        if self.buffer is None:
            raise RuntimeError("import the tensor first (import_into)")
        return Operand(self.buffer, 0, self.dtype, self.shape)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
