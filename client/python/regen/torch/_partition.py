# SPDX-License-Identifier: Apache-2.0
"""The joint graph's rewrite before AOTAutograd splits it into a forward and
a backward: values the backward can make again from half the bytes are
made there, not saved.

1. A loss's log-probabilities.  A model's ``F.cross_entropy(logits.float()
   .view(-1, V), targets)`` traces to ``_log_softmax`` of the logits cast
   to f32, read by ``nll_loss_forward`` and, in the backward, by
   ``nll_loss_backward`` and ``_log_softmax_backward_data``.  AOTAutograd's
   own split saves the log-probabilities: an [N, V] f32 tensor, twice the
   bf16 logits, that the forward writes whole to read one element a row
   and the backward reads whole again.  Recomputed in the backward from
   the saved logits, the forward only needs each row's logsumexp and its
   target's logit, and the backward reads the logits once and writes their
   gradient once (the lowering's _write_softmax).
2. A half-precision tensor widened to f32 (RMSNorm's ``x.float()``): the
   backward casts the saved bf16 tensor itself, in the kernel that reads
   it, rather than the forward writing the f32 copy for it.
3. An activation whose input the backward reads anyway, read in the
   backward only by elementwise ops (SwiGLU's ``silu(gate)``, beside
   ``silu_backward(grad, gate)``): the backward computes it again in the
   kernel that reads gate, rather than the forward writing it.  Not where
   a GEMM reads it (GELU's output, the next weight's gradient): there it
   would be written again in the backward.

Inductor's min-cut split decides the same of these three.  A copy reads
nothing the forward alone makes, so the split puts it in the backward and
saves what it reads.  Only torch.fx here: the pass is tested with any
torch that has AOTAutograd.
"""

import copy
import operator
import os
import warnings

import torch
import torch.fx
import torch.utils._pytree as pytree

__all__ = ["recompute_for_backward", "with_recompute"]

_HALVES = (torch.float16, torch.bfloat16)


def _ops():
    aten = torch.ops.aten
    casts = {aten._to_copy.default}
    prims = getattr(torch.ops, "prims", None)
    if prims is not None and hasattr(prims, "convert_element_type"):
        casts.add(prims.convert_element_type.default)
    views = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
    return aten, casts, views


def _activations():
    aten = torch.ops.aten
    return {aten.silu.default, aten.gelu.default, aten.relu.default, aten.sigmoid.default, aten.tanh.default}


def _elementwise():
    """What reads an activation in the kernel it is made in (the lowering
    fuses these): products, sums and the activations' own gradients."""
    aten, casts, _ = _ops()
    return casts | {aten.mul.Tensor, aten.mul.Scalar, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor,
                    aten.neg.default, aten.silu_backward.default, aten.gelu_backward.default,
                    aten.threshold_backward.default, aten.sigmoid_backward.default, aten.tanh_backward.default}


def _meta(node):
    """(dtype, device) of the tensor a node makes, where its meta says."""
    v = node.meta.get("val", node.meta.get("tensor_meta")) if isinstance(node, torch.fx.Node) else None
    return getattr(v, "dtype", None), getattr(v, "device", None)


def _widens(node):
    """A half-precision tensor cast to f32 on its own device."""
    (to, where), (frm, was) = _meta(node), _meta(node.args[0] if node.args else None)
    return to == torch.float32 and frm in _HALVES and where == was


def _backward_nodes(graph, num_fwd_outputs=None):
    """The nodes the forward's outputs do not need: the backward's (as
    AOTAutograd's split places them).  The forward's outputs are the first
    ``num_fwd_outputs`` of the joint graph's; without it (torch before
    2.0), those that read no tangent."""
    out = [n for n in graph.nodes if n.op == "output"][0]
    outs = pytree.tree_flatten(out.args)[0]
    if num_fwd_outputs is None:
        tangent = set()
        for n in graph.nodes:
            if (n.op == "placeholder" and n.name.startswith("tangents")) or \
                    any(a in tangent for a in n.all_input_nodes):
                tangent.add(n)
        forward_outs = [x for x in outs if isinstance(x, torch.fx.Node) and x not in tangent]
    else:
        forward_outs = [x for x in outs[:num_fwd_outputs] if isinstance(x, torch.fx.Node)]
    needed, stack = set(), list(forward_outs)
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    return {n for n in graph.nodes if n.op == "call_function" and n not in needed}


def _last_forward(graph):
    """The last node AOTAutograd tagged as the forward's, where it tags
    them (torch 2.11: each node with the pass that traced it); None where
    it does not. Its split then takes every node up to it as the
    forward's, by place, not by what the forward's outputs need."""
    last = None
    for n in graph.nodes:
        if n.meta.get("partitioner_tag") == "is_forward":
            last = n
    return last


def _copy_for(graph, chain, readers):
    """Copies ``chain`` (a node, then what it reads through, last first in
    the list's reverse) for ``readers`` (the backward's), which then read
    the copy of chain[0]. Returns whether it copied.

    Where AOTAutograd tags the nodes, the copy must come after the last
    forward node, or its split takes it as the forward's and saves it;
    tagged as the forward's after it (its original's tag), it moved the
    forward's end into the backward and the split refused the graph (Llama,
    torch 2.11: "Node t_32 was invalid, but is output"). A reader placed
    before that end (autograd's detach of a saved output) moves after the
    copy where all it feeds is after the end too; one that cannot keeps
    reading the original."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    last = _last_forward(graph)
    moved = []
    if last is not None:
        end = order[last]
        early = [u for u in readers if order[u] <= end]
        readers = [u for u in readers if order[u] > end]
        # What the early readers feed before the end moves with them (a
        # detach of a detach), none of it the forward's (it reads the
        # backward's copy); not a tuple's parts, which the split saves one
        # by one where they are.
        group, stack = set(), list(early)
        while stack:
            n = stack.pop()
            if n not in group:
                group.add(n)
                stack.extend(x for x in n.users if order[x] <= end)
        if not any(x.target is operator.getitem for n in group for x in n.users):
            moved = sorted(group, key=order.__getitem__)
            readers += early
        if not readers:
            return False
        # Before the first reader and the first of what the moved ones feed.
        after = [u for u in readers if u not in group] + [x for n in moved for x in n.users if x not in group]
        where = min(after, key=order.__getitem__) if after else last.next
    else:
        where = min(readers, key=order.__getitem__)
    copies = {}
    with graph.inserting_before(where):
        for c in reversed(chain):
            copies[c] = graph.node_copy(c, lambda a: copies.get(a, a))
            if last is not None:
                copies[c].meta["partitioner_tag"] = "is_backward"
    for u in moved:
        where.prepend(u)
        u.meta["partitioner_tag"] = "is_backward"
    for u in readers:
        u.replace_input_with(chain[0], copies[chain[0]])
    return True


def recompute_for_backward(graph, num_fwd_outputs=None):
    """Rewrites ``graph`` (a joint graph) as the module's docstring says:
    each ``_log_softmax`` that the forward reads only through
    ``nll_loss_forward`` gets a copy for the backward's readers, made from
    the same input through the same views and casts; each cast of a
    half-precision tensor to f32 that both passes read gets one for the
    backward's, and so does each activation (3.) the backward may make
    again for free.  ``num_fwd_outputs``: as AOTAutograd gives the split.
    Returns how many it copied."""
    aten, casts, views = _ops()
    activations, elementwise = _activations(), _elementwise()
    late = _backward_nodes(graph, num_fwd_outputs)
    copied = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node in late:
            continue
        readers = [u for u in node.users if u in late]
        early = [u for u in node.users if u not in late]
        if not readers or not early:
            continue
        if node.target is aten._log_softmax.default:
            if any(u.op != "call_function" or u.target is not aten.nll_loss_forward.default for u in early):
                continue
            chain, src = [node], node.args[0]
            while isinstance(src, torch.fx.Node) and src.op == "call_function" and \
                    src.target in casts | views and len(src.users) == 1:
                chain.append(src)
                src = src.args[0]
        elif node.target in casts and _widens(node):
            chain = [node]
        elif node.target in activations and all(u.target in elementwise for u in readers) and \
                all(x.op == "placeholder" or any(u in late for u in x.users) for x in node.all_input_nodes):
            chain = [node]
        else:
            continue
        copied += _copy_for(graph, chain, readers)
    if copied:
        graph.lint()
    return copied


def with_recompute(partition_fn):
    """AOTAutograd's ``partition_fn`` that first rewrites the joint graph
    (a copy of it). A graph the rewrite or the split of the rewritten graph
    cannot take is split as it came, with a warning, since the rewrite only
    saves bytes; with REGEN_COMPILE_DUMP set, the rewritten graph is kept
    there to read."""
    def split(joint_module, joint_inputs, **kwargs):
        rewritten = None
        try:
            rewritten = copy.deepcopy(joint_module)
            if recompute_for_backward(rewritten.graph, kwargs.get("num_fwd_outputs")):
                rewritten.recompile()
                return partition_fn(rewritten, joint_inputs, **kwargs)
        except Exception as e:   # noqa: BLE001 - any failure leaves the graph as AOTAutograd gave it
            warnings.warn(f"regen backend: the joint graph is split as it came ({type(e).__name__}: {e})")
            _keep_failed(rewritten, e)
        return partition_fn(joint_module, joint_inputs, **kwargs)
    return split


def _keep_failed(rewritten, error):
    dump = os.environ.get("REGEN_COMPILE_DUMP")
    if not dump or rewritten is None:
        return
    os.makedirs(dump, exist_ok=True)
    n = len([f for f in os.listdir(dump) if f.startswith("partition-failed")])
    with open(os.path.join(dump, f"partition-failed-{n}.txt"), "w") as f:
        f.write(f"# {type(error).__name__}: {error}\n")
        f.write(str(rewritten.graph))
        f.write("\n# each node's meta, as the split reads it\n")
        for node in rewritten.graph.nodes:
            f.write(f"{node.name}: {_meta_read(node)}\n")


def _meta_read(node):
    """What of a node's meta decides where AOTAutograd's split puts it:
    its tags, whether it has a tensor's meta, the kind of its value."""
    said = {k: str(v) for k, v in node.meta.items() if k in ("partitioner_tag", "recompute", "ac_graph_id")}
    said["tensor_meta"] = "tensor_meta" in node.meta
    said["val"] = type(node.meta.get("val")).__name__
    return said
