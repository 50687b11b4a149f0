# SPDX-License-Identifier: Apache-2.0
"""The joint graph's rewrite before AOTAutograd splits it into a forward and
a backward: the log-probabilities of a loss are recomputed in the backward
from the logits the forward had, rather than saved.

A model's ``F.cross_entropy(logits.float().view(-1, V), targets)`` traces
to ``_log_softmax`` of the logits cast to f32, read by ``nll_loss_forward``
and, in the backward, by ``nll_loss_backward`` and
``_log_softmax_backward_data``.  AOTAutograd's own split saves the
log-probabilities: an [N, V] f32 tensor, twice the bf16 logits, that the
forward writes whole to read one element a row and the backward reads
whole again.  Recomputed in the backward from the saved logits, the
forward only needs each row's logsumexp and its target's logit, and the
backward reads the logits once and writes their gradient once (the
lowering's _write_softmax; Inductor's min-cut split decides the same).
Only torch.fx here: the pass is tested with any torch that has AOTAutograd.
"""

import torch
import torch.fx

__all__ = ["recompute_log_probabilities", "with_recompute"]


def _targets():
    aten = torch.ops.aten
    passes = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten._to_copy.default}
    prims = getattr(torch.ops, "prims", None)
    if prims is not None and hasattr(prims, "convert_element_type"):
        passes.add(prims.convert_element_type.default)
    return (aten._log_softmax.default, aten.nll_loss_forward.default,
            (aten.nll_loss_backward.default, aten._log_softmax_backward_data.default),
            (aten.detach.default, aten.alias.default), passes)


def _read_by(node, readers, aliases):
    """Whether ``node`` is one of ``readers``, or an alias (detach) read
    by them alone."""
    if node.op != "call_function":
        return False
    if node.target in readers:
        return True
    return node.target in aliases and bool(node.users) and all(_read_by(u, readers, aliases) for u in node.users)


def recompute_log_probabilities(graph):
    """Gives each ``_log_softmax`` that the forward reads only through
    ``nll_loss_forward`` a copy, placed before its first backward reader,
    made from the same input through the same views and casts, for the
    backward's readers.  The copy reads nothing the forward alone makes, so
    AOTAutograd's split puts it in the backward and saves what it reads
    (the logits, before their cast where the cast has no other reader).
    Returns how many it copied."""
    log_softmax, nll_forward, backward_readers, aliases, passes = _targets()
    order = {n: i for i, n in enumerate(graph.nodes)}
    copied = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not log_softmax:
            continue
        late = [u for u in node.users if _read_by(u, backward_readers, aliases)]
        early = [u for u in node.users if u not in late]
        if not late or not early or any(u.op != "call_function" or u.target is not nll_forward for u in early):
            continue
        chain = [node]
        src = node.args[0]
        while isinstance(src, torch.fx.Node) and src.op == "call_function" and src.target in passes and \
                len(src.users) == 1:
            chain.append(src)
            src = src.args[0]
        copies = {}
        with graph.inserting_before(min(late, key=order.__getitem__)):
            for c in reversed(chain):
                copies[c] = graph.node_copy(c, lambda a: copies.get(a, a))
        for u in late:
            u.replace_input_with(node, copies[node])
        copied += 1
    if copied:
        graph.lint()
    return copied


def with_recompute(partition_fn):
    """AOTAutograd's ``partition_fn`` that first rewrites the joint graph."""
    def split(joint_module, joint_inputs, **kwargs):
        if recompute_log_probabilities(joint_module.graph):
            joint_module.recompile()
        return partition_fn(joint_module, joint_inputs, **kwargs)
    return split
