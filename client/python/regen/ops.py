"""The compute operations, as proto/compute.h's op tables define them:
each operation's method, its operands (in slot order) and its scalars.
The client builds its calls from this table; tests/test_ops.py holds it to
the C tables (tests/unit/op_table_json), so the two cannot drift."""

__all__ = ["NAME_SETS", "OPS", "Op", "OperandSpec", "REQUIRED_NAMES", "SLOT_NAMES", "OP_IDS", "DTYPE_CODES",
           "EPILOGUE_CODES", "COMPUTE_CODES", "ALIGNMENT_CODES"]

from collections import namedtuple

OperandSpec = namedtuple("OperandSpec", "name output required rank dtypes")
Op = namedtuple("Op", "name method operands scalars")

OPS = {
    "gemm": Op(
        "gemm", "io.regen.Compute.Gemm",
        (
            OperandSpec("a", False, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("b", False, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("c", False, False, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("d", True, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("bias", False, False, 1, ('f32', 'f16', 'bf16')),
            OperandSpec("aux", False, False, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("aux_out", True, False, 2, ('f32', 'f16', 'bf16')),
        ),
        (("trans_a", "bool"), ("trans_b", "bool"), ("alpha", "float"), ("beta", "float"), ("epilogue", "string"), ("compute", "string"),),
    ),
    "attention": Op(
        "attention", "io.regen.Compute.Attention",
        (
            OperandSpec("q", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("k", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("v", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("o", True, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("stats", True, False, 3, ('f32',)),
            OperandSpec("seq_len_q", False, False, 1, ('i32',)),
            OperandSpec("seq_len_kv", False, False, 1, ('i32',)),
        ),
        (("scale", "float"), ("causal", "bool"), ("causal_alignment", "string"),),
    ),
    "attention_backward": Op(
        "attention_backward", "io.regen.Compute.AttentionBackward",
        (
            OperandSpec("q", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("k", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("v", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("o", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("d_o", False, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("stats", False, True, 3, ('f32',)),
            OperandSpec("d_q", True, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("d_k", True, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("d_v", True, True, 4, ('f32', 'f16', 'bf16')),
            OperandSpec("seq_len_q", False, False, 1, ('i32',)),
            OperandSpec("seq_len_kv", False, False, 1, ('i32',)),
        ),
        (("scale", "float"), ("causal", "bool"), ("causal_alignment", "string"),),
    ),
    "layer_norm": Op(
        "layer_norm", "io.regen.Compute.LayerNorm",
        (
            OperandSpec("x", False, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("weight", False, True, 1, ('f32', 'f16', 'bf16')),
            OperandSpec("bias", False, False, 1, ('f32', 'f16', 'bf16')),
            OperandSpec("y", True, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("mean", True, False, 1, ('f32',)),
            OperandSpec("rstd", True, False, 1, ('f32',)),
        ),
        (("eps", "float"),),
    ),
    "layer_norm_backward": Op(
        "layer_norm_backward", "io.regen.Compute.LayerNormBackward",
        (
            OperandSpec("d_y", False, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("x", False, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("weight", False, True, 1, ('f32', 'f16', 'bf16')),
            OperandSpec("mean", False, True, 1, ('f32',)),
            OperandSpec("rstd", False, True, 1, ('f32',)),
            OperandSpec("d_x", True, True, 2, ('f32', 'f16', 'bf16')),
            OperandSpec("d_weight", True, False, 1, ('f32', 'f16', 'bf16')),
            OperandSpec("d_bias", True, False, 1, ('f32', 'f16', 'bf16')),
            OperandSpec("d_residual", False, False, 2, ('f32', 'f16', 'bf16')),
        ),
        (),
    ),
}

# Per op, read on every call by the client and regen.torch: its operands'
# names in slot order (a ring record's), the same as a set, and the names
# of those it requires.
SLOT_NAMES = {name: tuple(o.name for o in op.operands) for name, op in OPS.items()}
NAME_SETS = {name: frozenset(names) for name, names in SLOT_NAMES.items()}
REQUIRED_NAMES = {name: tuple(o.name for o in op.operands if o.required) for name, op in OPS.items()}

# What a call says in a ring record's terms (proto/ring.h, libregen's
# struct regen_record_call): the op by its id (enum rp_op_id), dtypes,
# epilogues, compute modes and causal alignments by their codes (proto/
# operand.h, proto/compute.h).
# TODO(facts-once): generate these from the op table and the enums with the
# rest of this module.
OP_IDS = {"gemm": 0, "attention": 1, "attention_backward": 2, "layer_norm": 3, "layer_norm_backward": 4}
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2, "i32": 3}
EPILOGUE_CODES = {"none": 0, "bias": 1, "gelu": 2, "gelu_bias": 3, "dgelu": 4, "gelu_aux": 5, "gelu_aux_bias": 6}
COMPUTE_CODES = {"f32": 0, "tf32": 1}
ALIGNMENT_CODES = {"top_left": 0, "bottom_right": 1}
