# SPDX-License-Identifier: Apache-2.0
"""regen._accel (regen/_accel.c), the C encoder of regen.torch's chained
calls, against the client's Python encoder (ring.record_struct, whose bytes
the worker's tests hold to proto/ring.h): the same record, byte for byte,
for random operands; the submission counter published and the worker's
sleeping flag returned; and every case it does not cover refused with -1
and nothing written.  No regend and no torch: tensors are stand-ins with
the attributes the encoder reads.  Skipped where the module was not built,
unless REGEN_REQUIRE_ACCEL=1 (meson sets it where it built the module)."""

import ctypes
import os
import random
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from regen import accel, ops, ring  # noqa: E402

ENTRIES = 8
DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "i32": 3}


class FakeTensor:
    """What queue_tensors reads of a torch tensor."""

    def __init__(self, dtype, shape, strides, device, ptr):
        self.dtype, self.shape, self._strides, self._device, self._ptr = dtype, tuple(shape), tuple(strides), device, ptr

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device

    def data_ptr(self):
        return self._ptr


class Broken(FakeTensor):
    def data_ptr(self):
        raise RuntimeError("data_ptr failed")


def row_major_for_ones(shape, strides):
    """The strides regend wants: a dimension of size 1 takes the row-major
    stride (torch lets it have any)."""
    out, step = list(strides), 1
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == 1:
            out[i] = step
        step *= max(shape[i], 1)
    return out


@unittest.skipIf(accel.module is None and os.environ.get("REGEN_REQUIRE_ACCEL") != "1",
                 "regen._accel was not built (Python's headers missing?)")
class AccelTest(unittest.TestCase):
    def setUp(self):
        self.assertIsNotNone(accel.module, "REGEN_REQUIRE_ACCEL=1 but regen._accel did not load")
        self.rng = random.Random(os.environ.get("REGEN_TEST_SEED", None) or self.id())
        self.size = ring.ring_size(ENTRIES)
        self.mem = (ctypes.c_char * self.size)()
        self.addr = ctypes.addressof(self.mem)
        # Chunks of "pool" memory and the lane's id table.
        self.kept, self.bound = [], {}
        base = 1 << 40
        # Enough spans that finding one takes several bisection steps.
        for i in range(37):
            start = base + i * (1 << 32) + self.rng.randrange(1 << 20) * 256
            ident = f"b0.1.{self.rng.randrange(1 << 40)}"
            # Buffers as libregen's pool hands them (ids) and as Buffer
            # objects (with .id): both are taken.
            buf = ident if i % 2 == 0 else type("Buf", (), {"id": ident})()
            self.kept.append((start, start + (1 << 30), buf))
            self.bound[ident] = self.rng.randrange(0, 256)

    def random_tensor(self, device=0):
        rank = self.rng.randint(1, 4)
        shape = [self.rng.choice([1, self.rng.randint(2, 4096)]) for _ in range(rank)]
        strides = [self.rng.randint(0, 1 << 20) for _ in range(rank)]
        start, end, _ = self.rng.choice(self.kept)
        ptr = start + self.rng.randrange(0, 1 << 29) * 2
        return FakeTensor(self.rng.choice(list(DTYPES)), shape, strides, device, ptr)

    def python_record(self, tag, op, record, signal, names, tensors):
        """The record as the client's Python path writes it."""
        layout, fields = [], []
        for n in names:
            t = tensors.get(n)
            if t is None:
                layout.append(None)
                fields.append(ring.NONE)
                continue
            ptr = t.data_ptr()
            for start, end, buf in self.kept:
                if start <= ptr < end:
                    break
            ident = buf if isinstance(buf, str) else buf.id
            ring.put_slot(layout, fields, self.bound[ident], DTYPES[t.dtype], ptr - start, t.shape,
                          row_major_for_ones(t.shape, t.stride()))
        flags, epilogue, compute, alignment, alpha, beta, scale, deadline = record
        out = bytearray(ring.RECORD_SIZE)
        ring.record_struct(tuple(layout)).pack_into(
            out, 0, tag, ring.OP_IDS[op], flags, epilogue, compute, alignment, ring.NONE, signal, deadline, alpha,
            beta, scale, *fields, *([ring.NONE] * (ring.SLOTS - len(layout))))
        return bytes(out)

    def queue(self, tail, tag, op, record, signal, names, tensors, local=0):
        return accel.module.queue_tensors(self.addr, ENTRIES, tail, tag, ring.OP_IDS[op], record, signal, names,
                                          tensors, local, self.kept, self.bound, DTYPES)

    def random_call(self):
        op = self.rng.choice(sorted(ops.SLOT_NAMES))
        names = ops.SLOT_NAMES[op]
        tensors = {n: (self.random_tensor() if self.rng.random() < 0.7 else None) for n in names}
        record = (self.rng.randrange(8), self.rng.randrange(7), self.rng.randrange(2), self.rng.randrange(2),
                  self.rng.uniform(-4, 4), self.rng.uniform(-4, 4), self.rng.uniform(0, 2),
                  self.rng.randrange(1 << 32))
        signal = self.rng.choice([ring.NONE, self.rng.randrange(256)])
        return op, names, tensors, record, signal

    def test_records_match_the_python_encoder(self):
        words = memoryview(self.mem).cast("B").cast("I")
        for i in range(300):
            op, names, tensors, record, signal = self.random_call()
            tail = self.rng.choice([i, 0xFFFFFFFF, self.rng.randrange(1 << 32)])
            tag = self.rng.randrange(1 << 64)
            sleeping = self.rng.randrange(2)
            words[ring.SQ_SLEEPING] = sleeping
            r = self.queue(tail, tag, op, record, signal, names, tensors)
            self.assertEqual(r, sleeping, "the worker's sleeping flag comes back")
            at = ring.HEADER_SIZE + (tail & (ENTRIES - 1)) * ring.RECORD_SIZE
            written = bytes(self.mem[at:at + ring.RECORD_SIZE])
            expected = self.python_record(tag, op, record, signal, names, tensors)
            self.assertEqual(written, expected, f"record {i} ({op}) differs from the Python encoder's")
            self.assertEqual(words[ring.SQ_TAIL], (tail + 1) & 0xFFFFFFFF, "the submission counter is published")
        words.release()

    def test_uncovered_calls_write_nothing(self):
        op, names = "gemm", ops.SLOT_NAMES["gemm"]
        record = (0, 0, 0, 0, 1.0, 0.0, 0.0, 0)

        def call_with(bad):
            tensors = {"a": self.random_tensor(), "b": self.random_tensor(), "d": bad}
            before = bytes(self.mem)
            r = self.queue(3, 4, op, record, ring.NONE, names, tensors)
            self.assertEqual(bytes(self.mem), before, "nothing written")
            return r

        t = self.random_tensor()
        cases = {
            "an unknown dtype": FakeTensor("f64", t.shape, t.stride(), 0, t.data_ptr()),
            "another device": FakeTensor(t.dtype, t.shape, t.stride(), 1, t.data_ptr()),
            "rank 5": FakeTensor(t.dtype, [2] * 5, [1] * 5, 0, t.data_ptr()),
            "rank 0": FakeTensor(t.dtype, [], [], 0, t.data_ptr()),
            "outside every kept chunk": FakeTensor(t.dtype, t.shape, t.stride(), 0, 4096),
            "past every kept chunk": FakeTensor(t.dtype, t.shape, t.stride(), 0, self.kept[-1][1] + 64),
            "at a chunk's end": FakeTensor(t.dtype, t.shape, t.stride(), 0, self.kept[3][1]),
            "between two chunks": FakeTensor(t.dtype, t.shape, t.stride(), 0, self.kept[20][1] + 4096),
            "strides of another rank": FakeTensor(t.dtype, [2, 2], [1], 0, t.data_ptr()),
            "a shape past 64 bits": FakeTensor(t.dtype, [1 << 64], [1], 0, t.data_ptr()),
        }
        for what, bad in cases.items():
            with self.subTest(what):
                self.assertEqual(call_with(bad), -1)
        with self.subTest("an error raised by the tensor"):
            with self.assertRaises(RuntimeError):
                call_with(Broken(t.dtype, t.shape, t.stride(), 0, t.data_ptr()))
        with self.subTest("a buffer the lane has not bound"):
            del self.bound[next(iter(self.bound))]
            self.kept = self.kept[:1]
            self.assertEqual(call_with(self.random_tensor()), -1)

    def test_bad_arguments_are_refused(self):
        names = ops.SLOT_NAMES["gemm"]
        record = (0, 0, 0, 0, 1.0, 0.0, 0.0, 0)
        with self.assertRaises(ValueError):   # no ring
            accel.module.queue_tensors(0, ENTRIES, 0, 1, 0, record, ring.NONE, names, {}, 0, self.kept, self.bound,
                                       DTYPES)
        with self.assertRaises(ValueError):   # entries not a power of two
            accel.module.queue_tensors(self.addr, 6, 0, 1, 0, record, ring.NONE, names, {}, 0, self.kept,
                                       self.bound, DTYPES)
        with self.assertRaises(ValueError):   # more operands than a record holds
            accel.module.queue_tensors(self.addr, ENTRIES, 0, 1, 0, record, ring.NONE, ("a",) * 12, {}, 0,
                                       self.kept, self.bound, DTYPES)
        with self.assertRaises(TypeError):
            accel.module.queue_tensors(self.addr, ENTRIES, 0, 1, 0, record, ring.NONE, list(names), {}, 0,
                                       self.kept, self.bound, DTYPES)


if __name__ == "__main__":
    unittest.main()
