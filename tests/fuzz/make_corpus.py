#!/usr/bin/env python3
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
for name, p in attb_cases.items():
    write('attention_backward', name + '.json', dump(p))

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
