#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the hand-made seeds of tests/fuzz/corpus/<target>/: valid calls
from the IDL and edge cases around each rule. libFuzzer's own finds are
merged in by `scripts/fuzz --merge`. Run from anywhere; rewrites only the
seed-*.json / seed-* files it owns."""
import json, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
corpus = os.path.join(here, 'corpus')

def op(buf, shape, dtype='f32', offset=None, strides=None):
    o = {'buffer': buf, 'dtype': dtype, 'shape': shape}
    if offset is not None:
        o['offset'] = offset
    if strides is not None:
        o['strides'] = strides
    return o

def dump(x):
    return json.dumps(x, separators=(',', ':')).encode()

def write(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'seed-' + name), 'wb') as f:
        f.write(data)

M = 16
gemm_ok = {'a': op('b0.1.1', [M, M]), 'b': op('b0.1.2', [M, M]), 'd': op('b0.1.3', [M, M])}
gemm_cases = {
    'basic': gemm_ok,
    'one-buffer': {'a': op('b0.1.1', [16, 8]), 'b': op('b0.1.1', [8, 4], offset=512),
                   'd': op('b0.1.1', [16, 4], offset=1024)},
    'trans-bias-gelu': {'a': op('b0.1.1', [8, 16], 'bf16'), 'b': op('b0.1.2', [4, 8], 'bf16'),
                        'd': op('b0.1.3', [16, 4]), 'bias': op('b0.1.4', [4]), 'trans_a': True,
                        'trans_b': True, 'epilogue': 'gelu_bias', 'alpha': 0.5},
    'dgelu': {'a': op('b0.1.1', [4, 8]), 'b': op('b0.1.2', [8, 4]), 'c': op('b0.1.3', [4, 4]),
              'd': op('b0.1.3', [4, 4]), 'aux': op('b0.1.4', [4, 4], strides=[8, 1]), 'beta': 1.0,
              'epilogue': 'dgelu'},
    'gelu-aux-bias': {'a': op('b0.1.1', [4, 8], 'bf16'), 'b': op('b0.1.2', [8, 4], 'bf16'),
                      'd': op('b0.1.3', [4, 4], 'bf16'), 'bias': op('b0.1.3', [4], 'bf16', offset=64),
                      'aux_out': op('b0.1.4', [4, 4], 'bf16', strides=[8, 1]), 'epilogue': 'gelu_aux_bias'},
    'c-alias-d': {'a': op('b0.1.1', [4, 4]), 'b': op('b0.1.2', [4, 4]), 'c': op('b0.1.3', [4, 4]),
                  'd': op('b0.1.3', [4, 4]), 'beta': 1.0, 'compute': 'tf32'},
    'padded': {'a': op('b0.1.1', [4, 4], strides=[8, 1]), 'b': op('b0.1.2', [4, 4], strides=[4, 1]),
               'd': op('b0.1.3', [4, 4], strides=[6, 1], offset=8)},
    'events': dict(gemm_ok, wait_event='e0.1.5', signal_event='e0.1.6'),
    'overlap': {'a': op('b0.1.1', [4, 4]), 'b': op('b0.1.2', [4, 4]), 'd': op('b0.1.1', [4, 4], offset=32)},
    'huge': {'a': op('b0.1.1', [2147483648, 2147483648]), 'b': op('b0.1.2', [2147483648, 1]),
             'd': op('b0.1.3', [2147483648, 1], offset=9007199254740992)},
    'bad-k': {'a': op('b0.1.1', [4, 5]), 'b': op('b0.1.2', [4, 4]), 'd': op('b0.1.3', [4, 4])},
    'beta-no-c': dict(gemm_ok, beta=2.0),
    'misaligned': dict(gemm_ok, a=op('b0.1.1', [M, M], 'f16', offset=3)),
    'stride0': dict(gemm_ok, a=op('b0.1.1', [M, M], strides=[0, 1])),
    'null-opt': dict(gemm_ok, c=None, bias=None, alpha=None),
    'unknown': dict(gemm_ok, extra=1),
    # FP8: TN, per-tensor scales; fast accumulation; an FP8 d with its scale and amax
    'fp8': {'a': op('b0.1.1', [16, 32], 'e4m3'), 'b': op('b0.1.2', [8, 32], 'e4m3'), 'trans_b': True,
            'd': op('b0.1.3', [16, 8], 'bf16'), 'a_scale': op('b0.1.4', [1]), 'b_scale': op('b0.1.4', [1], offset=4),
            'compute': 'fp8_fast_accum'},
    'fp8-d': {'a': op('b0.1.1', [16, 32], 'e5m2'), 'b': op('b0.1.2', [8, 32], 'e4m3'), 'trans_b': True,
              'd': op('b0.1.3', [16, 8], 'e5m2'), 'a_scale': op('b0.1.4', [1]),
              'b_scale': op('b0.1.4', [1], offset=4), 'd_scale': op('b0.1.4', [1], offset=8),
              'amax_d': op('b0.1.4', [1], offset=12)},
    'fast-accum-f32': dict(gemm_ok, compute='fp8_fast_accum'),
}
for name, p in gemm_cases.items():
    write('gemm', name + '.json', dump(p))
write('gemm', 'inf.json', dump(gemm_ok)[:-1] + b',"alpha":1e999}')
write('gemm', 'dup.json', dump(gemm_ok)[:-1] + b',"a":{"buffer":"b0.1.9","dtype":"f32","shape":[16,16]}}')

B, H, S, D = 2, 2, 8, 16
def att(dt='f16', sq=S, skv=S, d=D, dv=D, bufs=('b0.1.1', 'b0.1.2', 'b0.1.3', 'b0.1.4')):
    return {'q': op(bufs[0], [B, H, sq, d], dt), 'k': op(bufs[1], [B, H, skv, d], dt),
            'v': op(bufs[2], [B, H, skv, dv], dt), 'o': op(bufs[3], [B, H, sq, dv], dt)}
att_cases = {
    'basic': att(),
    'stats-causal': dict(att(sq=4, skv=8, dv=8), stats=op('b0.1.5', [B, H, 4]), causal=True, scale=0.125),
    'one-buffer': att(bufs=('b0.1.1',) * 4),
    'strided': dict(att(), q=op('b0.1.1', [B, H, S, D], 'f16', strides=[H * S * 32, S * 32, 32, 1])),
    'broadcast-o': dict(att(), o=op('b0.1.4', [B, H, S, D], 'f16', strides=[0, 0, 0, 1])),
    'scale0': dict(att(), scale=0),
    'bad-rank': dict(att(), q=op('b0.1.1', [S, D], 'f16')),
    'dtype-mix': dict(att(), k=op('b0.1.2', [B, H, S, D], 'bf16')),
    'events': dict(att(), wait_event='e0.1.9', signal_event='b0.1.9'),
    # Sequence lengths: i32 [B], together; one alone, another dtype, another
    # batch, cuDNN's own [B,1,1,1] shape, lengths aliasing o.
    'lengths': dict(att(), seq_len_q=op('b0.1.6', [B], 'i32'), seq_len_kv=op('b0.1.6', [B], 'i32', offset=8)),
    'lengths-bottom-right-sq-gt-skv': dict(att(sq=12, skv=8), causal=True, causal_alignment='bottom_right',
                                           seq_len_q=op('b0.1.6', [B], 'i32'), seq_len_kv=op('b0.1.7', [B], 'i32')),
    'lengths-q-only': dict(att(), seq_len_q=op('b0.1.6', [B], 'i32')),
    'lengths-f32': dict(att(), seq_len_q=op('b0.1.6', [B]), seq_len_kv=op('b0.1.7', [B], 'i32')),
    'lengths-batch': dict(att(), seq_len_q=op('b0.1.6', [B + 1], 'i32'), seq_len_kv=op('b0.1.7', [B], 'i32')),
    'lengths-rank4': dict(att(), seq_len_q=op('b0.1.6', [B, 1, 1, 1], 'i32'),
                          seq_len_kv=op('b0.1.7', [B, 1, 1, 1], 'i32')),
    'lengths-over-o': dict(att(), seq_len_q=op('b0.1.4', [B], 'i32'), seq_len_kv=op('b0.1.7', [B], 'i32')),
    'q-i32': dict(att(), q=op('b0.1.1', [B, H, S, D], 'i32')),
}
for name, p in att_cases.items():
    write('attention', name + '.json', dump(p))

def attb(dt='bf16', bufs=None):
    names = ['q', 'k', 'v', 'o', 'd_o', 'd_q', 'd_k', 'd_v']
    shapes = {'q': [B, H, S, D], 'k': [B, H, S, D], 'v': [B, H, S, D], 'o': [B, H, S, D],
              'd_o': [B, H, S, D], 'd_q': [B, H, S, D], 'd_k': [B, H, S, D], 'd_v': [B, H, S, D]}
    p = {}
    for i, n in enumerate(names):
        p[n] = op(bufs[i] if bufs else 'b0.1.%d' % (i + 1), shapes[n], dt)
    p['stats'] = op(bufs[8] if bufs else 'b0.1.9', [B, H, S])
    return p
attb_cases = {
    'basic': attb(),
    'causal-scale': dict(attb('f16'), causal=True, scale=0.25),
    'one-buffer-overlap': attb(bufs=['b0.1.1'] * 9),
    'no-stats': {k: v for k, v in attb().items() if k != 'stats'},
}
size = B * H * S * D * 2
p = attb(bufs=['b0.1.1'] * 9)
for i, n in enumerate(['q', 'k', 'v', 'o', 'd_o', 'd_q', 'd_k', 'd_v']):
    p[n]['offset'] = i * size
p['stats']['offset'] = 8 * size
attb_cases['one-buffer-disjoint'] = p
attb_cases['lengths'] = dict(attb(), causal=True, seq_len_q=op('b0.1.10', [B], 'i32'),
                             seq_len_kv=op('b0.1.10', [B], 'i32', offset=16))
attb_cases['lengths-kv-only'] = dict(attb(), seq_len_kv=op('b0.1.10', [B], 'i32'))
attb_cases['lengths-under-d_q'] = dict(attb(), seq_len_q=op('b0.1.6', [B], 'i32'),
                                       seq_len_kv=op('b0.1.10', [B], 'i32'))
for name, p in attb_cases.items():
    write('attention_backward', name + '.json', dump(p))

# LayerNorm: x [R, N] rows padded, its vectors and statistics; the backward
# with d_residual, in place too.
R, N = 6, 40
def ln(dt='bf16', bufs=('b0.1.1', 'b0.1.2', 'b0.1.3', 'b0.1.4')):
    return {'x': op(bufs[0], [R, N], dt, strides=[48, 1]), 'weight': op(bufs[1], [N], dt),
            'bias': op(bufs[1], [N], dt, offset=128), 'y': op(bufs[2], [R, N], dt),
            'mean': op(bufs[3], [R]), 'rstd': op(bufs[3], [R], offset=64)}
ln_cases = {
    'basic': ln(),
    'minimal': {'x': op('b0.1.1', [3, 1]), 'weight': op('b0.1.2', [1]), 'y': op('b0.1.3', [3, 1])},
    'eps-events': dict(ln('f16'), eps=1e-3, wait_event='e0.1.5', signal_event='e0.1.6', deadline_ms=100),
    'one-buffer': dict(ln('f32', bufs=('b0.1.1',) * 4), weight=op('b0.1.1', [N], 'f32', offset=2048),
                       bias=op('b0.1.1', [N], 'f32', offset=2304), y=op('b0.1.1', [R, N], 'f32', offset=4096),
                       mean=op('b0.1.1', [R], offset=6144), rstd=op('b0.1.1', [R], offset=6400)),
    'longest-row': {'x': op('b0.1.1', [1, 65536]), 'weight': op('b0.1.2', [65536]), 'y': op('b0.1.3', [1, 65536])},
    'row-too-long': {'x': op('b0.1.1', [1, 65537]), 'weight': op('b0.1.2', [65537]), 'y': op('b0.1.3', [1, 65537])},
    'eps0': dict(ln(), eps=0),
    'eps-inf': ln(),
    'y-over-x': dict(ln(), y=op('b0.1.1', [R, N], 'bf16', offset=32)),
    'rstd-over-mean': dict(ln(), rstd=op('b0.1.4', [R], offset=8)),
    'mean-bf16': dict(ln(), mean=op('b0.1.4', [R], 'bf16')),
    'weight-f32': dict(ln(), weight=op('b0.1.2', [N])),
    'rows-overlap': dict(ln(), x=op('b0.1.1', [R, N], 'bf16', strides=[39, 1])),
    'y-broadcast': dict(ln(), y=op('b0.1.3', [R, N], 'bf16', strides=[0, 1])),
}
for name, p in ln_cases.items():
    write('layer_norm', name + '.json', dump(p))
write('layer_norm', 'eps-inf.json', dump(ln())[:-1] + b',"eps":1e999}')

def lnb(dt='bf16'):
    return {'d_y': op('b0.1.5', [R, N], dt), 'x': op('b0.1.1', [R, N], dt, strides=[48, 1]),
            'weight': op('b0.1.2', [N], dt), 'mean': op('b0.1.4', [R]), 'rstd': op('b0.1.4', [R], offset=64),
            'd_x': op('b0.1.6', [R, N], dt), 'd_weight': op('b0.1.7', [N], dt),
            'd_bias': op('b0.1.7', [N], dt, offset=128), 'd_residual': op('b0.1.8', [R, N], dt, strides=[64, 1])}
lnb_cases = {
    'basic': lnb(),
    'minimal': {k: v for k, v in lnb('f32').items() if k not in ('d_weight', 'd_bias', 'd_residual')},
    'in-place': dict(lnb(), d_x=op('b0.1.8', [R, N], 'bf16', strides=[64, 1])),
    'in-place-shifted': dict(lnb(), d_x=op('b0.1.8', [R, N], 'bf16', offset=2, strides=[64, 1])),
    'd_x-over-d_y': dict(lnb(), d_x=op('b0.1.5', [R, N], 'bf16')),
    'eps': dict(lnb(), eps=1e-5),
    'd_weight-over-d_bias': dict(lnb(), d_bias=op('b0.1.7', [N], 'bf16', offset=40)),
    'd_residual-f16': dict(lnb(), d_residual=op('b0.1.8', [R, N], 'f16')),
    'mean-short': dict(lnb(), mean=op('b0.1.4', [R - 1])),
}
for name, p in lnb_cases.items():
    write('layer_norm_backward', name + '.json', dump(p))

operands = {
    'basic': op('b0.1.1', [4, 4]),
    'rank4': op('b3.7.12', [1, 2, 3, 4], 'bf16', offset=64, strides=[100, 50, 10, 1]),
    'rank5': op('b0.1.1', [1, 1, 1, 1, 1]),
    'zero-dim': op('b0.1.1', [0, 4]),
    'neg-stride': op('b0.1.1', [4, 4], strides=[-4, 1]),
    'overflow': op('b0.1.1', [2147483648, 2147483648, 2147483648, 2]),
    'max-offset': op('b0.1.1', [1], offset=9007199254740992),
    'event-id': op('e0.1.1', [1]),
    'gen0': op('b0.0.1', [1]),
    'leading-zero': op('b0.01.1', [1]),
    'float-dim': op('b0.1.1', [1.5]),
    'strides-rank': op('b0.1.1', [2, 2], strides=[1]),
    'null': None,
}
for i, (name, o) in enumerate(operands.items()):
    sz = [0, 64, 1 << 20, 0xffffffffffffffff][i % 4]
    flags = i % 4
    write('operand', name + '.bin', struct.pack('<QB', sz, flags) + dump(o))

params = [
    (0, {'device': 0, 'kind': 'host_fd', 'size': 4096, 'fd': 0}),
    (0, {'device': 0, 'kind': 'cuda_ipc', 'size': 4096, 'offset': 0, 'handle': '00' * 64}),
    (0, {'device': -1, 'kind': '', 'size': 1.5}),
    (1, {'buffer': 'b0.1.1'}),
    (2, {'device': 0, 'handle': 'ab' * 64}),
    (3, {'event': 'e0.1.1'}),
    (4, {'device': 1, 'reason': 'rank 3 failed', 'deadline_ms': 1000}),
    (4, {'device': None, 'reason': None}),
    (5, {'device': 0}),
    (6, {'device': 0, 'kind': 'hang'}),
    (7, {}),
    (8, {'interface': 'io.regen.Compute'}),
    (9, {'pid': 1, 'worker_socket': '/run/regen/regend.sock.dev0', 'backend': 'host', 'memory_used': 0,
         'memory_baseline': 0}),
    (10, {'i': 9007199254740992, 'f': -0.0, 'b': False, 's': 'cuda_fd', 'o': {}, 'a': []}),
    (10, {'i': 9007199254740993, 'f': 1e308}),
]
for i, (t, p) in enumerate(params):
    write('params', '%02d.bin' % i, bytes([t]) + dump(p))
write('params', 'dup.bin', bytes([1]) + b'{"buffer":"b0.1.1","buffer":"b0.1.2"}')
write('params', 'array.bin', bytes([7]) + b'[1,2]')

calls = [
    {'method': 'io.regen.Device.Status', 'parameters': {}},
    {'method': 'io.regen.Device.Watch', 'parameters': {}, 'more': True},
    {'method': 'io.regen.Device.Restart', 'parameters': {'device': 0, 'reason': 'x', 'deadline_ms': 100}},
    {'method': 'io.regen.Device.InjectFault', 'parameters': {'device': 0, 'kind': 'crash'}, 'oneway': True},
    {'method': 'io.regen.Memory.ImportBuffer', 'parameters': {'device': 0, 'kind': 'host_fd', 'size': 4096, 'fd': 0}},
    {'method': 'io.regen.Memory.CloseBuffer', 'parameters': {'buffer': 'b0.1.1'}},
    {'method': 'io.regen.Compute.Gemm', 'parameters': gemm_ok},
    {'method': 'io.regen.Compute.Attention', 'parameters': att()},
    {'method': 'org.varlink.service.GetInfo'},
    {'method': 'org.varlink.service.GetInterfaceDescription', 'parameters': {'interface': 'io.regen'}},
    {'parameters': {'epoch': 1, 'devices': []}},
    {'parameters': {'epoch': 2}, 'continues': True},
    {'error': 'io.regen.StaleGeneration', 'parameters': {'device': 0, 'generation': 4, 'message': 'x'}},
]
edge = [b'', b'{}', b'[]', b'null', b'{"method":""}', b'{"method":"x","oneway":true,"more":true}',
        b'{"method":"x","method":"y"}', b'{"method":"x","unknown":1}', b'{"more":true}',
        b'{"method":"x","parameters":[]}', b'{"method":"x"} trailing', b'{"method":"x"}\n\t ',
        b'[' * 33 + b']' * 33, b'{"method":"x","parameters":' + b'{"a":' * 31 + b'1' + b'}' * 32,
        b'{"method":"\\u0000x"}', b'{"method":"x","continues":true}', b'{"method":"x","oneway":1}',
        b'"\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["', b'{"method":"x"', b'\xff\xfe{"method":"x"}']
for i, c in enumerate(calls):
    write('message', 'call%02d.json' % i, dump(c))
for i, e in enumerate(edge):
    write('message', 'edge%02d.json' % i, e)

# Framing: op bytes as fuzz_frame.c reads them.
def chunk(data, nfds=0):
    b = (1 | (nfds << 2)) if nfds else 0
    return bytes([b]) + struct.pack('<H', len(data)) + data
msgs = [dump(c) + b'\0' for c in calls]
stream = b''.join(msgs)
write('frame', 'whole', bytes([3]) + chunk(stream) + b'\x03')
write('frame', 'split', bytes([1]) + b''.join(chunk(stream[i:i + 7]) for i in range(0, len(stream), 7)) + b'\x03')
write('frame', 'fds', bytes([2]) + chunk(msgs[4], 1) + chunk(msgs[0]) + chunk(msgs[4][:10], 17) +
      chunk(msgs[4][10:]) + b'\x03')
write('frame', 'too-large', bytes([3]) + chunk(b'{"method":"x","parameters":{"s":"') + bytes([2 | (40 << 2)]) + b'a' +
      chunk(b'"}}\0' + msgs[0]) + b'\x03')
write('frame', 'nul-only', bytes([0]) + chunk(b'\0\0\0') + b'\x03' + chunk(b'partial'))
write('frame', 'interleaved', bytes([1]) + chunk(msgs[0][:5]) + b'\x03' + chunk(msgs[0][5:] + msgs[1], 2) +
      b'\x03' + chunk(b'{"method":"x"} junk\0'))

# Memory and Device codecs: the first byte picks the decoder (fuzz_codecs.c).
H = 'ab' * 64
device_info = {'index': 0, 'generation': 3, 'state': 'ready', 'backend': 'host',
               'worker_socket': '/run/regen/regend.sock.dev0', 'worker_pid': 41234, 'respawns': 1,
               'memory_used': 0, 'memory_baseline': 0, 'reason': 'restart by pid 5120: rank 3 failed'}
codecs = [
    (0, {'device': 0, 'kind': 'host_fd', 'size': 4096, 'fd': 0}),
    (0, {'device': 0, 'kind': 'cuda_ipc', 'size': 4096, 'offset': 512, 'handle': H}),
    (0, {'device': 0, 'kind': 'cuda_fd', 'size': 281474976710656, 'offset': 0, 'fd': 15}),
    (0, {'device': 0, 'kind': 'cuda_ipc', 'size': 1, 'handle': 'zz', 'fd': None}),
    (0, {'device': 1, 'kind': 'tape', 'size': 0}),
    (1, {'device': 0, 'handle': H.upper()}),
    (1, {'device': 0, 'handle': '0g' * 64}),
    (2, {'buffer': 'b0.1.1'}),
    (2, {'buffer': 'e4294967295.18446744073709551615.0'}),
    (3, {'event': 'e0.01.1'}),
    (4, {'buffer': 'b0.3.17', 'generation': 3, 'size': 4096, 'later': [1]}),
    (4, {'event': 'e1.2.9', 'generation': 2}),
    (5, {'epoch': 7, 'devices': [device_info, dict(device_info, index=1, state='respawning', worker_pid=-1)]}),
    (5, {'epoch': 7, 'devices': [], 'elapsed_us': 12345}),
    (5, {'epoch': 7, 'devices': [dict(device_info, state='sleeping')]}),
    (6, {'epoch': 9, 'device': 1, 'generation': 4, 'state': 'ready', 'reason': 'subscribed'}),
    (6, {'epoch': 9, 'device': 4294967296, 'generation': 4, 'state': 'ready', 'reason': ''}),
]
for i, (t, p) in enumerate(codecs):
    write('codecs', '%02d.bin' % i, bytes([t]) + dump(p))

# ---- The daemon targets ----

B, H, S, D = 2, 2, 8, 16     # H was a handle above

# fuzz_objects: one byte per operation (low nibble: 0/1 add, 2/3 find,
# 4 find a made-up id, 5 ref, 6 unref, 7 close, 8 close_all, 9 a
# connection put, 10 one got, 11 generation bump; bit 4 client B, bit 5
# event, bit 6 close_all with the bump), then its arguments.
objects = {
    'add-find': [0x00, 0x10, 0x20, 0x02, 0x00, 0x12, 0x00, 0x22, 0x02, 0x03, 0x01, 0x32, 0x01],
    'ref-close-unref': [0x00, 0x05, 0x00, 0x05, 0x00, 0x07, 0x00, 0x02, 0x00, 0x06, 0x00, 0x06, 0x00],
    'generation': [0x00, 0x10, 0x0b, 0x02, 0x00, 0x4b, 0x00, 0x02, 0x02, 0x12, 0x01],
    'client-put': [0x00, 0x10, 0x20, 0x0a, 0x09, 0x02, 0x00, 0x09, 0x02, 0x00, 0x19, 0x12, 0x01],
    'made-up-ids': [0x00, 0x10, 0x04, 0x00, 0x01, 0x00, 0x44, 0x00, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00,
                    0x04, 0x00, 0x02, 0x01, 0x14, 0x00, 0x01, 0x20, 0x04, 0x00, 0x01, 0xff] + [7] * 8,
    'close-all-held': [0x00, 0x20, 0x05, 0x00, 0x05, 0x01, 0x08, 0x06, 0x00, 0x02, 0x00, 0x06, 0x01],
}
for name, ops in objects.items():
    write('objects', name, bytes(ops))

# fuzz_lifecycle: one byte per event (bit 7: device 1; low nibble: 0
# request [verb, deadline], 1 answer ok, 2 answer otherwise [how], 3 Ready,
# 4 fault [kind], 5 exit [how], 6 channel lost, 7 deadline timer, 8 respawn
# timer, 9 a signalled worker dies, 10 spawning fails or works, 11 kill,
# 12 epoch or memory refresh [which]).
lifecycle = {
    'start': [0x03, 0x83],
    'release': [0x03, 0x83, 0x00, 0x00, 0x03, 0x01, 0x01],
    'reset-both': [0x03, 0x83, 0x00, 0x01, 0x02, 0x80, 0x01, 0x02, 0x01, 0x81, 0x01, 0x81],
    'restart-fault-while-draining': [0x03, 0x00, 0x02, 0x03, 0x04, 0x00, 0x01, 0x01],
    'not-drained': [0x03, 0x00, 0x00, 0x01, 0x02, 0x00, 0x09, 0x03, 0x08],
    'unhealthy': [0x03, 0x00, 0x01, 0x01, 0x01, 0x02, 0x00, 0x09, 0x08, 0x03],
    'error-reply': [0x03, 0x00, 0x02, 0x01, 0x02, 0x01, 0x09, 0x03],
    'exit-mid-release': [0x03, 0x00, 0x00, 0x01, 0x01, 0x05, 0x01, 0x03],
    'deadline': [0x03, 0x00, 0x01, 0x00, 0x07, 0x09, 0x03, 0x07],
    'awaiting-timeout': [0x03, 0x00, 0x00, 0x01, 0x07, 0x07, 0x09, 0x08, 0x03],
    'spawn-fails': [0x03, 0x0a, 0x05, 0x00, 0x08, 0x08, 0x0a, 0x08, 0x03],
    'channel-lost': [0x03, 0x06, 0x00, 0x00, 0x03, 0x05, 0x00, 0x03],
    'channel-lost-draining': [0x03, 0x00, 0x02, 0x03, 0x06, 0x05, 0x00, 0x08, 0x03],
    'stats-epoch': [0x03, 0x0c, 0x00, 0x0c, 0x01, 0x01, 0x8c, 0x00],
    'fault-idle': [0x03, 0x04, 0x01, 0x01, 0x01],
    'fault-twice': [0x03, 0x04, 0x01, 0x04, 0x00, 0x01, 0x01, 0x01, 0x01],
    'kill': [0x03, 0x0b, 0x09, 0x08, 0x03],
    'queue': [0x03, 0x00, 0x00, 0x03, 0x00, 0x01, 0x03, 0x00, 0x02, 0x03, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01],
    'before-ready': [0x00, 0x00, 0x03, 0x05, 0x00, 0x08, 0x03, 0x01, 0x01],
}
for name, ops in lifecycle.items():
    write('lifecycle', name, bytes(ops))

# fuzz_dispatch: a stream of messages, each ended by a NUL; bytes after the
# last NUL are a message begun and never ended. A message goes with as many
# fds as it holds the letters "fd".
def call(method, params=None, **flags):
    c = {'method': method}
    if params is not None:
        c['parameters'] = params
    c.update(flags)
    return dump(c)

def stream(*msgs, tail=b''):
    return b''.join(m + b'\0' for m in msgs) + tail

def imp(size=1024, handle='ab' * 64):
    return call('io.regen.Memory.ImportBuffer', {'device': 0, 'kind': 'cuda_ipc', 'size': size, 'handle': handle})

gemm3 = {'a': op('b0.1.1', [M, M]), 'b': op('b0.1.2', [M, M]), 'd': op('b0.1.3', [M, M])}
dispatch = {
    'info': stream(call('org.varlink.service.GetInfo'), call('org.varlink.service.GetInfo', {'x': 1}),
                   call('org.varlink.service.GetInterfaceDescription', {'interface': 'io.regen'}),
                   call('org.varlink.service.GetInterfaceDescription', {'interface': 'io.regen.Memory'}),
                   call('org.varlink.service.GetInterfaceDescription', {'interface': 'io.regen.Worker'}),
                   call('org.varlink.service.GetInterfaceDescription', {'interface': 'nope'}),
                   call('org.varlink.service.GetInterfaceDescription'), call('io.regen.Nope.X'), call('nodot'),
                   call('io.regen.Device.Nope'), call('.x'), call('io.regen.Device.Generation')),
    'memory': stream(imp(), imp(), imp(),
                     call('io.regen.Memory.ImportBuffer', {'device': 0, 'kind': 'host_fd', 'size': 4096, 'fd': 0}),
                     call('io.regen.Memory.ImportBuffer', {'device': 0, 'kind': 'host_fd', 'size': 4096, 'fd': 9}),
                     call('io.regen.Memory.ImportBuffer', {'device': 1, 'kind': 'cuda_ipc', 'size': 1, 'handle': 'ab' * 64}),
                     call('io.regen.Memory.ImportBuffer', {'device': 0, 'kind': 'cuda_ipc', 'size': 13, 'handle': 'ab' * 64}),
                     call('io.regen.Memory.ImportEvent', {'device': 0, 'handle': 'cd' * 64}),
                     call('io.regen.Compute.Gemm', gemm3),
                     call('io.regen.Memory.CloseBuffer', {'buffer': 'b0.1.1'}),
                     call('io.regen.Memory.CloseBuffer', {'buffer': 'b0.1.1'}),
                     call('io.regen.Compute.Gemm', gemm3),
                     call('io.regen.Memory.CloseEvent', {'event': 'e0.1.5'}),
                     call('io.regen.Memory.CloseEvent', {'event': 'b0.1.2'}),
                     call('io.regen.Memory.CloseBuffer', {'buffer': 'b0.2.2'})),
    # An offset of 7 elements (mod 13) makes the stub refuse the submit, 11 fail the call.
    'compute': stream(imp(4096), imp(), imp(), call('io.regen.Memory.ImportEvent', {'device': 0, 'handle': 'cd' * 64}),
                      call('io.regen.Compute.Gemm', gemm3),
                      call('io.regen.Compute.Gemm', dict(gemm3, a=op('b0.1.1', [M, M], offset=28))),
                      call('io.regen.Compute.Gemm', dict(gemm3, a=op('b0.1.1', [M, M], offset=44))),
                      call('io.regen.Compute.Gemm', dict(gemm3, wait_event='e0.1.4', signal_event='e0.1.4')),
                      call('io.regen.Compute.Gemm', dict(gemm3, b=op('b0.1.2', [M, 64]), d=op('b0.1.3', [M, 64]))),
                      call('io.regen.Compute.Attention', att(bufs=('b0.1.1', 'b0.1.2', 'b0.1.3', 'b0.1.3'))),
                      call('io.regen.Compute.Attention', att()),
                      call('io.regen.Compute.AttentionBackward', attb()),
                      call('io.regen.Compute.Gemm', gemm3, oneway=True),
                      call('io.regen.Compute.Gemm', gemm3, more=True),
                      call('io.regen.Compute.Nope', {})),
    'lifecycle': stream(call('io.regen.Device.Status'), call('io.regen.Device.Generation', {}),
                        call('io.regen.Device.Release', {'device': 0, 'reason': 'x'}),
                        call('io.regen.Device.Reset', {}),
                        call('io.regen.Device.Restart', {'device': 1, 'deadline_ms': 10}),
                        call('io.regen.Device.Restart', {'device': 7}),
                        call('io.regen.Device.Release', {'deadline_ms': 10}),
                        call('io.regen.Device.InjectFault', {'device': 0, 'kind': 'hang'}),
                        call('io.regen.Device.InjectFault', {'device': 0, 'kind': 'melt'}),
                        call('io.regen.Device.Status', {}), call('io.regen.Memory.ImportBuffer', {}),
                        call('io.regen.Compute.Gemm', {'device': 1}),
                        call('io.regen.Device.Watch', {}), call('io.regen.Device.Watch', {}, more=True),
                        call('io.regen.Device.Restart', {'reason': 'after watch'}), call('io.regen.Device.Status')),
    'oneway': stream(call('io.regen.Device.Status', oneway=True), call('io.regen.Device.Release', oneway=True),
                     call('io.regen.Device.Watch', oneway=True), imp()[:-1] + b',"oneway":true}',
                     call('io.regen.Memory.CloseBuffer', {'buffer': 'b0.1.1'}, oneway=True),
                     call('nope', oneway=True), call('io.regen.Device.Generation')),
    'bad': stream(b'', b'{}', b'[]', b'null', b'{"method":""}', b'{"method":"x","oneway":true,"more":true}',
                  b'\xff\xfe{"method":"x"}', b'{"method":"io.regen.Device.Status\\u0000junk"}',
                  b'{"method":"io.regen.Device.Generation","parameters":null}',
                  b'{"method":"io.regen.Device.Generation","parameters":{"x\\u0000":1}}',
                  b'{"method":"x","parameters":' + b'{"a":' * 40 + b'1' + b'}' * 41,
                  b'{"parameters":{}}', b'{"error":"io.regen.Nope","parameters":{}}', b'{"method":"x"} trailing',
                  b'{"method":"io.regen.Memory.CloseBuffer","parameters":{"buffer":"b0.1.1\\u0000garbage"}}',
                  b'{"method":"org.varlink.service.GetInfo","upgrade":true}',
                  b'{"method":"io.regen.Device.Generation","more":true}'),
    'fds': stream(call('io.regen.Device.Generation', {'pad': 'fd' * 17}),
                  call('io.regen.Memory.ImportBuffer', {'device': 0, 'kind': 'host_fd', 'size': 64, 'fd': 1}),
                  call('io.regen.Memory.CloseBuffer', {'buffer': 'b0.1.1', 'fd': 1}),
                  call('io.regen.Device.Generation'), tail=b'{"method":"fd fd'),
    # A client's Release on the main socket moves the worker on too (the
    # harness drives its control channel): ids of generation 1 go stale.
    'generation': stream(imp(), imp(), imp(), call('io.regen.Compute.Gemm', gemm3),
                         call('io.regen.Device.Release', {'device': 0}), call('io.regen.Compute.Gemm', gemm3),
                         call('io.regen.Memory.CloseBuffer', {'buffer': 'b0.1.1'}), imp(), imp(), imp(),
                         call('io.regen.Compute.Gemm', {'a': op('b0.2.4', [M, M]), 'b': op('b0.2.5', [M, M]),
                                                        'd': op('b0.2.6', [M, M])}),
                         call('io.regen.Device.Reset', {}), call('io.regen.Compute.Gemm', gemm3),
                         call('io.regen.Memory.CloseBuffer', {'buffer': 'b0.2.4'}), imp()),
    # A Watch, more calls than the connection holds behind it, every reply
    # read, then the close: the hangup came while the connection was not
    # read, and used to wake the loop for ever with the connection kept.
    'watch-backpressure-hangup': stream(call('io.regen.Device.Watch', {}, more=True),
                                        *[call('io.regen.Device.Generation')] * 300),
    # HUP: once every reply before it is read, the client stops reading.
    # Two Watches on the connection, then a Restart: the announcement's
    # write fails, the close drops the watchers while the announcement walks
    # them (a use after free in watch.c before 35df7f0).
    'hup-watch-announce': stream(call('io.regen.Device.Watch', {}, more=True),
                                 call('io.regen.Device.Watch', {}, more=True), b'HUP',
                                 call('io.regen.Device.Restart', {'device': 0}), call('io.regen.Device.Generation')),
    # Buffers held, then calls pipelined behind a reply that cannot be written.
    'hup-compute': stream(imp(), imp(), imp(), b'HUP', call('io.regen.Compute.Gemm', gemm3),
                          call('io.regen.Compute.Gemm', gemm3), imp(), call('io.regen.Device.Release', {'device': 0}),
                          call('io.regen.Compute.Gemm', gemm3), b'HUP', imp()),
    'pipelined': stream(*[call('io.regen.Device.Generation')] * 300),
    'partial': stream(call('io.regen.Device.Generation'), tail=b'{"method":"io.regen.Device.Sta'),
}
for name, data in dispatch.items():
    write('dispatch', name, data)

# fuzz_resolution: [op | objects made before a generation change << 4],
# [number of objects - 1], a byte per object (size index | event 0x10 |
# another process's 0x20 | closed 0x40), then the call's parameters.
# Sizes: 1 2 16 64 255 256 1024 4096 4097 65536 2^20 2^31 2^32 2^40 2^48 8190.
K1 = 6       # 1024 bytes: a 16x16 f32 matrix, a [2,2,8,16] f16 tensor
res = {
    'gemm-ok': (0x00, [K1, K1, K1], gemm3),
    'gemm-small': (0x00, [K1, 5, K1], gemm3),
    'gemm-other': (0x00, [K1, K1 | 0x20, K1], gemm3),
    'gemm-closed': (0x00, [K1, K1, K1 | 0x40], gemm3),
    'gemm-stale': (0x10, [K1, K1, K1, K1], {'a': op('b0.1.1', [M, M]), 'b': op('b0.2.2', [M, M]),
                                            'd': op('b0.2.3', [M, M])}),
    'gemm-current': (0x10, [K1, K1, K1, K1], {'a': op('b0.2.2', [M, M]), 'b': op('b0.2.3', [M, M]),
                                              'd': op('b0.2.4', [M, M])}),
    'gemm-events': (0x00, [K1, K1, K1, 0x10, 0x10], dict(gemm3, wait_event='e0.1.4', signal_event='e0.1.5')),
    'gemm-event-other': (0x00, [K1, K1, K1, 0x30], dict(gemm3, wait_event='e0.1.4')),
    'gemm-event-is-buffer': (0x00, [K1, K1, K1, K1], dict(gemm3, signal_event='b0.1.4')),
    'gemm-buffer-is-event': (0x00, [K1, 0x10, K1], gemm3),
    'gemm-device1': (0x00, [K1, K1, K1], dict(gemm3, d=op('b1.1.3', [M, M]))),
    'gemm-one-buffer': (0x00, [7], {'a': op('b0.1.1', [16, 8]), 'b': op('b0.1.1', [8, 4], offset=512),
                                    'd': op('b0.1.1', [16, 4], offset=1024)}),
    'gemm-bias-c': (0x00, [K1, K1, K1, K1, 2], dict(gemm3, c=op('b0.1.4', [M, M]), beta=1.0, bias=op('b0.1.5', [M]),
                                                    epilogue='bias')),
    'gemm-dgelu': (0x00, [K1, K1, K1, K1], dict(gemm3, aux=op('b0.1.4', [M, M]), epilogue='dgelu')),
    'gemm-dgelu-small-aux': (0x00, [K1, K1, K1, 5], dict(gemm3, aux=op('b0.1.4', [M, M]), epilogue='dgelu')),
    'gemm-gelu-aux': (0x00, [K1, K1, K1, K1], dict(gemm3, aux_out=op('b0.1.4', [M, M]), epilogue='gelu_aux')),
    'gemm-huge': (0x00, [14, 14, 14], {'a': op('b0.1.1', [1 << 20, 1 << 20], 'bf16'),
                                       'b': op('b0.1.2', [1 << 20, 8], 'bf16'), 'd': op('b0.1.3', [1 << 20, 8])}),
    'gemm-last-byte': (0x00, [K1, K1, 8], dict(gemm3, d=op('b0.1.3', [M, M], offset=3072))),
    'attention-ok': (0x01, [K1, K1, K1, K1], att()),
    'attention-stats': (0x01, [K1, K1, K1, K1, 2], dict(att(), stats=op('b0.1.5', [B, H, S]))),
    'attention-small-v': (0x01, [K1, K1, 5, K1], att()),
    'attention-backward': (0x02, [9], attb(bufs=['b0.1.1'] * 9)),
    'attention-backward-disjoint': (0x02, [9], attb_cases['one-buffer-disjoint']),
    # Lengths in a buffer of 16 bytes (index 2): B = 2 i32 fit, B + 2 not.
    'attention-lengths': (0x01, [K1, K1, K1, K1, 2], dict(att(), seq_len_q=op('b0.1.5', [B], 'i32'),
                                                          seq_len_kv=op('b0.1.5', [B], 'i32', offset=8))),
    'attention-lengths-past-end': (0x01, [K1, K1, K1, K1, 2], dict(att(), seq_len_q=op('b0.1.5', [B], 'i32'),
                                                                   seq_len_kv=op('b0.1.5', [B], 'i32', offset=12))),
    'attention-lengths-event': (0x01, [K1, K1, K1, K1, 0x10], dict(att(), seq_len_q=op('b0.1.5', [B], 'i32'),
                                                                   seq_len_kv=op('b0.1.5', [B], 'i32'))),
    # LayerNorm's [6, 40] f32 (960 bytes) fits 1024; its [40] vectors and
    # [6] statistics a buffer of 255 (index 4), not 64 (index 3).
    'layer-norm': (0x03, [K1, 4, K1, 4], {'x': op('b0.1.1', [6, 40]), 'weight': op('b0.1.2', [40]),
                                          'bias': op('b0.1.2', [40], offset=160), 'y': op('b0.1.3', [6, 40]),
                                          'mean': op('b0.1.4', [6]), 'rstd': op('b0.1.4', [6], offset=32)}),
    'layer-norm-small-weight': (0x03, [K1, 3, K1], {'x': op('b0.1.1', [6, 40]), 'weight': op('b0.1.2', [40]),
                                                    'y': op('b0.1.3', [6, 40])}),
    'layer-norm-backward': (0x04, [K1, K1, 4, 4, K1, K1], {
        'd_y': op('b0.1.1', [6, 40]), 'x': op('b0.1.2', [6, 40]), 'weight': op('b0.1.3', [40]),
        'mean': op('b0.1.4', [6]), 'rstd': op('b0.1.4', [6], offset=32), 'd_x': op('b0.1.5', [6, 40]),
        'd_weight': op('b0.1.3', [40], offset=160), 'd_residual': op('b0.1.6', [6, 40])}),
    'layer-norm-backward-in-place': (0x04, [K1, K1, 4, 4, K1], {
        'd_y': op('b0.1.1', [6, 40]), 'x': op('b0.1.2', [6, 40]), 'weight': op('b0.1.3', [40]),
        'mean': op('b0.1.4', [6]), 'rstd': op('b0.1.4', [6], offset=32), 'd_x': op('b0.1.5', [6, 40]),
        'd_residual': op('b0.1.5', [6, 40])}),
}
for name, (head, objs, params) in res.items():
    write('resolution', name, bytes([head, len(objs) - 1] + objs) + dump(params))

# io.regen.Lane records (fuzz_ring.c reads RECORD_SIZE bytes as one), version
# 2's eleven operand slots: the backward with its lengths in the last two.
RECORD_SIZE, NONE = 1024, 0xffffffff
def record(op_id, operands, flags=0, alignment=0, scale=0.0):
    head = struct.pack('<QHHBBBBIIIIdddQ', 99, op_id, flags, 0, 0, alignment, 0, NONE, NONE, 0, 0, 0.0, 0.0,
                       scale, 0)
    body = b''
    for o in operands + [None] * (11 - len(operands)):
        if o is None:
            body += struct.pack('<IBBHQ4q4q', NONE, 0, 0, 0, 0, *([0] * 8))
        else:
            index, dtype, offset, shape = o
            strides, step = [0] * len(shape), 1
            for i in range(len(shape) - 1, -1, -1):
                strides[i] = step
                step *= shape[i]
            pad = [0] * (4 - len(shape))
            body += struct.pack('<IBBHQ4q4q', index, dtype, len(shape), 0, offset, *shape, *pad, *strides, *pad)
    rec = head + body
    return rec + bytes(RECORD_SIZE - len(rec))
F16, F32, I32 = 1, 0, 3
t4 = [B, H, S, D]
bwd = [(0, F16, i * 4096, t4) for i in range(5)] + [(1, F32, 0, [B, H, S])] + \
      [(1, F16, 4096 * (i + 1), t4) for i in range(3)]
write('ring', 'attention-backward-lengths', record(2, bwd + [(1, I32, 16384, [B]), (1, I32, 16392, [B])], flags=4,
                                                   alignment=1))
write('ring', 'attention-lengths-q-only', record(1, [(0, F16, i * 4096, t4) for i in range(4)] +
                                                 [None, (1, I32, 0, [B])]))
write('ring', 'attention-lengths-slot-past-op', record(1, [(0, F16, i * 4096, t4) for i in range(4)] +
                                                       [None, None, None, None, None, None, (1, I32, 0, [B])]))
ln_ops = [(0, F32, 0, [6, 40]), (1, F32, 0, [40]), None, (0, F32, 4096, [6, 40]), (1, F32, 256, [6]),
          (1, F32, 512, [6])]
write('ring', 'layer-norm', record(3, ln_ops, scale=1e-3))
write('ring', 'layer-norm-default-eps', record(3, ln_ops))
write('ring', 'layer-norm-negative-eps', record(3, ln_ops, scale=-1.0))
write('ring', 'layer-norm-causal', record(3, ln_ops, flags=4))
lnb_ops = [(0, F32, 0, [6, 40]), (0, F32, 4096, [6, 40]), (1, F32, 0, [40]), (1, F32, 256, [6]),
           (1, F32, 512, [6]), (1, F32, 1024, [6, 40]), (1, F32, 2048, [40]), None, (1, F32, 1024, [6, 40])]
write('ring', 'layer-norm-backward-in-place', record(4, lnb_ops))
write('ring', 'layer-norm-backward-eps', record(4, lnb_ops, scale=1e-5))

# io.regen.Program.Run as ring records (version 3): the Run's own record and
# its continuations, against fuzz_ring.c's program (70 pairs x<i> -> y<i>,
# the second pair f16, then scalars a and b: 142 bound tensors) and its id
# table (buffers at 0, 1 and 4, events at 2 and 5, the program at 7).
RUN_ENTRIES, CONTINUATION_ENTRIES = 60, 63
def run_records(entries, flags=0, journal=NONE, journal_offset=0, seq=0, program=7, wait=NONE,
                continuations=None, head=0xfffffff0):
    binds = [e for e in entries if e[0] == 'b']
    scalars = [e for e in entries if e[0] == 's']
    packed = [struct.pack('<IIQ', pos, buf, off) for _, pos, buf, off in binds]
    packed += [struct.pack('<I4xd', pos, v) for _, pos, v in scalars]
    n = 1 if len(packed) <= RUN_ENTRIES else \
        1 + (len(packed) - RUN_ENTRIES + CONTINUATION_ENTRIES - 1) // CONTINUATION_ENTRIES
    recs = [struct.pack('<QHHHHIIIIIHHQQ8x', 500, 6, flags, n - 1 if continuations is None else continuations, 0,
                        wait, NONE, 0, program, journal, len(binds), len(scalars), journal_offset, seq)
            + b''.join(packed[:RUN_ENTRIES])]
    for part in range(1, n):
        at = RUN_ENTRIES + (part - 1) * CONTINUATION_ENTRIES
        recs.append(struct.pack('<QHHI', 500 + part, 0xffff, part, head)
                    + b''.join(packed[at:at + CONTINUATION_ENTRIES]))
    return [r + bytes(RECORD_SIZE - len(r)) for r in recs]
run_entries = [('b', i, i % 2, 16 * (i // 2)) for i in range(140)] + [('s', 140, 0.5), ('s', 141, -3.0)]
write('ring', 'run-whole', b''.join(run_records(run_entries)))
write('ring', 'run-journal-retry', b''.join(run_records(run_entries, flags=1, journal=4, journal_offset=64, seq=9)))
write('ring', 'run-seq-without-journal', b''.join(run_records(run_entries, seq=9)))
write('ring', 'run-journal-marks', b''.join(run_records(run_entries, flags=3, journal=4, journal_offset=64, seq=9)))
write('ring', 'run-marks-without-journal', b''.join(run_records(run_entries, flags=2)))
write('ring', 'run-event', b''.join(run_records(run_entries, wait=2)))
torn = run_records(run_entries)
torn[2] = torn[2][:10] + struct.pack('<H', 3) + torn[2][12:]
write('ring', 'run-torn-continuation', b''.join(torn))
write('ring', 'run-continuation-of-another-head', b''.join(run_records(run_entries, head=7)))
write('ring', 'run-span-past-the-ring', b''.join(run_records(run_entries, continuations=40)))
write('ring', 'run-a-binding-twice', b''.join(run_records(run_entries[:3] + [('b', 0, 0, 0)] + run_entries[4:])))
write('ring', 'run-f16-misaligned', b''.join(run_records(run_entries[:2] + [('b', 2, 0, 1)] + run_entries[3:])))
write('ring', 'run-scalar-nan', b''.join(run_records(run_entries[:-1] + [('s', 141, float('nan'))])))
write('ring', 'run-one-record', b''.join(run_records(run_entries[:60])))
write('ring', 'continuation-alone', run_records(run_entries)[1])

# io.regen.Program: [define, run] as fuzz_program.c reads them; valid
# programs of each op class and composite, and edges around each rule.
def tensor(name, kind, dtype=None, shape=None, **more):
    t = {'name': name, 'kind': kind}
    if dtype is not None:
        t['dtype'] = dtype
    if shape is not None:
        t['shape'] = shape
    t.update(more)
    return t

def node(op, inputs, outputs=None, name=None, attrs=None):
    n = {'op': op, 'inputs': inputs}
    if outputs is not None:
        n['outputs'] = outputs
    if name is not None:
        n['name'] = name
    if attrs is not None:
        n['attrs'] = attrs
    return n

def bind(*names, scalars=None):
    r = {'program': 'p0.0.1', 'bind': {n: {'buffer': 'b0.1.%d' % (i + 1)} for i, n in enumerate(names)}}
    if scalars:
        r['scalars'] = scalars
    return r

mlp = {'name': 'mlp', 'tensors': [
    tensor('x', 'input', 'bf16', [8, 16]), tensor('w', 'input', 'bf16', [32, 16]),
    tensor('h', 'intermediate', 'bf16', [8, 32]), tensor('g', 'intermediate', 'bf16', [8, 32]),
    tensor('lr', 'scalar'), tensor('y', 'output', 'f32', [8, 32]), tensor('ht', 'view', base='h', shape=[32, 8], strides=[1, 32])],
    'nodes': [node('gemm', {'a': 'x', 'b': 'w'}, {'d': 'h'}, 'fc', {'trans_b': True}),
              node('gelu_tanh', ['h'], ['g']), node('mul', ['g', 'lr'], ['y']),
              node('add', ['y'], ['y'], attrs={'scalar': 1.0})]}
norms = {'tensors': [
    tensor('x', 'input', 'f32', [4, 6]), tensor('w', 'input', 'f32', [6]), tensor('y', 'output', 'f32', [4, 6]),
    tensor('r', 'output', 'f32', [4]), tensor('dy', 'input', 'f32', [4, 6]), tensor('dx', 'output', 'f32', [4, 6]),
    tensor('dw', 'output', 'f32', [6]), tensor('s', 'output', 'bf16', [4, 6])],
    'nodes': [node('rms_norm', ['x', 'w'], ['y', 'r'], 'norm', {'eps': 1e-6}),
              node('rms_norm_backward', ['dy', 'x', 'w', 'r'], ['dx', 'dw'], 'normb'),
              node('softmax', ['x'], ['s'], 'sm')]}
ce = {'tensors': [
    tensor('logits', 'input', 'bf16', [4, 10]), tensor('t', 'input', 'i64', [4]), tensor('loss', 'output', 'f32', [4]),
    tensor('lse', 'output', 'f32', [4]), tensor('dl', 'output', 'bf16', [4, 10]), tensor('one', 'intermediate', 'f32', [4])],
    'nodes': [node('cross_entropy', ['logits', 't'], ['loss', 'lse'], 'ce'), node('fill', [], ['one'], attrs={'scalar': 1}),
              node('cross_entropy_backward', ['one', 'logits', 't', 'lse'], ['dl'], 'ceb', {'ignore_index': -1})]}
rope = {'tensors': [
    tensor('x', 'inout', 'bf16', [2, 5, 3, 8]), tensor('cos', 'input', 'f32', [5, 4]), tensor('sin', 'input', 'f32', [5, 4])],
    'nodes': [node('rotary', ['x', 'cos', 'sin'], ['x'], 'rope'),
              node('rotary_backward', ['x', 'cos', 'sin'], ['x'], 'ropeb', {'layout': 'bshd'})]}
adamw = {'tensors': [
    tensor('p', 'inout', 'f32', [10]), tensor('g', 'input', 'bf16', [10]), tensor('m', 'inout', 'f32', [10]),
    tensor('v', 'inout', 'f32', [10]), tensor('p2', 'inout', 'f32', [3]), tensor('g2', 'input', 'f32', [3]),
    tensor('b2', 'inout', 'f32', [3]), tensor('step', 'scalar'), tensor('lr', 'scalar')],
    'nodes': [node('adamw', ['p', 'g', 'm', 'v'], [], 'opt', {'lr': 'lr', 'step': 'step', 'weight_decay': 0.1}),
              node('sgd', ['p2', 'g2', 'b2'], None, 'sgd', {'lr': 'lr', 'momentum': 0.9, 'nesterov': True})]}
gather = {'tensors': [
    tensor('tab', 'input', 'f32', [10, 4]), tensor('ix', 'input', 'i32', [2, 3]), tensor('e', 'output', 'f32', [2, 3, 4]),
    tensor('dt', 'output', 'f32', [10, 4]), tensor('red', 'output', 'f32', [2, 3]), tensor('col', 'intermediate', 'f32', [3]),
    tensor('tot', 'output', 'f32', []), tensor('io', 'output', 'i64', [2, 3]), tensor('c', 'output', 'u8', [2, 3, 4])],
    'nodes': [node('embedding', ['tab', 'ix'], ['e']), node('embedding_backward', ['e', 'ix'], ['dt']),
              node('amax', ['e'], ['red']), node('mean', ['red'], ['col'], attrs={'axis': 'leading'}),
              node('sum', ['col'], ['tot'], attrs={'axis': 'last'}),
              node('iota', [], ['io'], attrs={'axis': 1}), node('gt', ['e', 'tot'], ['c'])]}
dropout = {'tensors': [
    tensor('seed', 'scalar'), tensor('x', 'input', 'bf16', [4, 6]), tensor('k', 'intermediate', 'bf16', [4, 6]),
    tensor('y', 'output', 'bf16', [4, 6]), tensor('m', 'output', 'u8', [6, 4]),
    tensor('mt', 'view', base='m', shape=[4, 6], strides=[1, 4])],
    'nodes': [node('dropout_mask', ['seed'], ['k'], 'drop', {'p': 0.1}), node('mul', ['x', 'k'], ['y']),
              node('dropout_mask', ['seed'], ['mt'], 'mask', {'p': 0.5, 'stream': 4294967295})]}
programs = {
    'dropout': [dropout, bind('x', 'y', 'm', scalars={'seed': 9007199254740991})],
    'dropout-run-fractional-seed': [dropout, bind('x', 'y', 'm', scalars={'seed': 0.5})],
    'dropout-seed-not-scalar': [{'tensors': [tensor('s', 'input', 'f64', []), tensor('y', 'output', 'u8', [3])],
                                 'nodes': [node('dropout_mask', ['s'], ['y'], attrs={'p': 0.2})]}],
    'dropout-no-seed': [{'tensors': [tensor('y', 'output', 'f32', [3])],
                         'nodes': [node('dropout_mask', [], ['y'], attrs={'p': 0.2})]}],
    'dropout-p-one': [{'tensors': [tensor('s', 'scalar'), tensor('y', 'output', 'f32', [3])],
                       'nodes': [node('dropout_mask', ['s'], ['y'], attrs={'p': 1})]}],
    'mlp': [mlp, bind('x', 'w', 'y', scalars={'lr': 0.5})],
    'mlp-run-missing': [mlp, bind('x', 'w', scalars={'lr': 0.5})],
    'mlp-run-misaligned': [mlp, dict(bind('x', 'w', 'y', scalars={'lr': 1}),
                                     bind={'x': {'buffer': 'b0.1.1', 'offset': 3}, 'w': {'buffer': 'b0.1.2'},
                                           'y': {'buffer': 'b0.1.3'}})],
    'norms': [norms, bind('x', 'w', 'y', 'r', 'dy', 'dx', 'dw', 's')],
    'cross-entropy': [ce, bind('logits', 't', 'loss', 'lse', 'dl')],
    'rotary': [rope, bind('x', 'cos', 'sin')],
    'optimizers': [adamw, bind('p', 'g', 'm', 'v', 'p2', 'g2', 'b2', scalars={'step': 1, 'lr': 1e-3})],
    'gather': [gather, bind('tab', 'ix', 'e', 'dt', 'red', 'tot', 'io', 'c')],
    'read-before-write': [{'tensors': [tensor('h', 'intermediate', 'f32', [2]), tensor('y', 'output', 'f32', [2])],
                           'nodes': [node('relu', ['h'], ['y']), node('fill', [], ['h'], attrs={'scalar': 0})]}],
    'alias': [{'tensors': [tensor('m', 'inout', 'f32', [4, 4]), tensor('mt', 'view', base='m', shape=[4, 4], strides=[1, 4])],
               'nodes': [node('neg', ['m'], ['mt'])]}],
    'broadcast-write': [{'tensors': [tensor('y', 'output', 'f32', [3]),
                                     tensor('yb', 'view', base='y', shape=[4, 3], strides=[0, 1])],
                         'nodes': [node('fill', [], ['yb'], attrs={'scalar': 1})]}],
    'view-outside': [{'tensors': [tensor('x', 'input', 'f32', [4]), tensor('v', 'view', base='x', offset=2, shape=[3])],
                      'nodes': []}],
    'unknown-op': [{'tensors': [], 'nodes': [node('conv2d', [], [])]}],
    'empty-strings': [{'tensors': [tensor('v', 'view', '', [1], base='')], 'nodes': [{'op': ''}]}],
    'huge': [{'tensors': [tensor('h', 'input', 'u8', [2147483648, 2147483648, 2147483648])], 'nodes': []}],
}
for name, p in programs.items():
    write('program', name + '.json', dump(p))
