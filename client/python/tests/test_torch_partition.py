# SPDX-License-Identifier: Apache-2.0
"""regen.torch._partition: the joint graph's rewrite before AOTAutograd's
split, through AOTAutograd itself (aot_function, on CPU tensors): a loss's
log-probabilities are recomputed in the backward from the logits rather
than saved, the loss and the gradients stay torch's own to the bit, and a
graph that reads the log-probabilities otherwise is left as it was.
Skipped where torch or its AOTAutograd is not importable."""

import importlib.util
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import torch
    import torch.nn.functional as F
    try:
        from torch._functorch.aot_autograd import aot_function
        from torch._functorch.partitioners import default_partition
    except ImportError:
        from functorch.compile import aot_function, default_partition
except ImportError:
    torch = None

_partition = None
if torch is not None:
    # The module alone: regen.torch's package would start a runtime.
    spec = importlib.util.spec_from_file_location(
        "regen_torch_partition", os.path.join(HERE, "..", "regen", "torch", "_partition.py"))
    _partition = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_partition)


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _val(node):
    """The tensor (or its metadata) a node makes, as the trace noted it."""
    return node.meta.get("val", node.meta.get("tensor_meta"))


def _f32_of_shape(nodes, *shapes):
    return [n for n in nodes if getattr(_val(n), "dtype", None) == torch.float32 and
            tuple(_val(n).shape) in shapes]


def _saved(gm):
    """The forward's outputs after the first (the loss): what it saves."""
    ret = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    return [n for n in ret[1:] if isinstance(n, torch.fx.Node)]


@unittest.skipIf(torch is None, "no torch with AOTAutograd")
class RecomputeTest(unittest.TestCase):
    def setUp(self):
        self.gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))

    def compiled(self, fn):
        graphs = {}

        def keep(kind):
            def compile_graph(gm, inputs):
                graphs[kind] = gm
                return gm
            return compile_graph
        return aot_function(fn, keep("forward"), keep("backward"),
                            partition_fn=_partition.with_recompute(default_partition)), graphs

    def inputs(self):
        h = torch.randn(6, 8, generator=self.gen).to(torch.bfloat16).requires_grad_()
        w = torch.randn(16, 8, generator=self.gen).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, 16, (6,), generator=self.gen)
        t[4] = -1
        return h, w, t

    def test_the_logits_are_saved_not_their_log_probabilities(self):
        def loss(h, w, t):
            logits = (h @ w.t()).view(2, 3, 16)   # a model's [B, S, V]
            return F.cross_entropy(logits.float().view(-1, 16), t, ignore_index=-1)
        fn, graphs = self.compiled(loss)
        h, w, t = self.inputs()
        got = fn(h, w, t)
        got.backward()
        dh, dw = h.grad.clone(), w.grad.clone()
        h.grad = w.grad = None
        want = loss(h, w, t)
        want.backward()
        # The same ops run: the loss and the gradients are torch's, bit for bit.
        self.assertTrue(torch.equal(got, want), (got, want))
        self.assertTrue(torch.equal(dh, h.grad) and torch.equal(dw, w.grad))
        saved = _saved(graphs["forward"])
        self.assertFalse([n for n in saved if "log_softmax" in str(n.target)], saved)
        self.assertFalse(_f32_of_shape(saved, (6, 16), (2, 3, 16)), f"an f32 [N, V] tensor saved: {saved}")
        self.assertIn("aten._log_softmax.default", _targets(graphs["backward"]))
        self.assertEqual(_targets(graphs["forward"]).count("aten._log_softmax.default"), 1)

    def test_log_probabilities_the_model_returns_stay_saved(self):
        def loss(h, w, t):
            lp = F.log_softmax((h @ w.t()).float(), dim=-1)
            return F.nll_loss(lp, t, ignore_index=-1), lp
        fn, graphs = self.compiled(loss)
        h, w, t = self.inputs()
        got, lp = fn(h, w, t)
        (got + lp.sum() * 0).backward()
        self.assertNotIn("aten._log_softmax.default", _targets(graphs["backward"]))

    def test_a_widening_cast_both_passes_read_is_made_again_in_the_backward(self):
        def rms_norm(x, w):
            h = x.float()   # RMSNorm as Llama writes it
            return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * w
        fn, graphs = self.compiled(lambda x, w: rms_norm(x, w).float().sum())
        x = torch.randn(4, 32, generator=self.gen).to(torch.bfloat16).requires_grad_()
        w = torch.randn(32, generator=self.gen).to(torch.bfloat16).requires_grad_()
        got = fn(x, w)
        got.backward()
        dx, dw = x.grad.clone(), w.grad.clone()
        x.grad = w.grad = None
        want = rms_norm(x, w).float().sum()
        want.backward()
        self.assertTrue(torch.equal(got, want), (got, want))
        self.assertTrue(torch.equal(dx, x.grad) and torch.equal(dw, w.grad))
        saved = _saved(graphs["forward"])
        self.assertFalse(_f32_of_shape(saved, (4, 32)), f"an f32 [4, 32] tensor saved: {saved}")
        self.assertIn("aten._to_copy.default", _targets(graphs["backward"]))

    def test_an_activation_whose_input_is_saved_anyway_is_made_again(self):
        def swiglu(x, w1, w3, w2):
            return (F.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t()   # Llama's FeedForward

        def mlp(x, w1, w2):
            return F.gelu(x @ w1.t()) @ w2.t()   # a GEMM reads GELU's output: saved
        for name, fn, shapes in (("swiglu", swiglu, ((6, 8), (16, 8), (16, 8), (8, 16))),
                                 ("gelu", mlp, ((6, 8), (16, 8), (8, 16)))):
            with self.subTest(name):
                # Against the same graph split as it came: the activation's
                # backward may trace otherwise than eager's kernel (torch
                # 1.13 writes silu's out in sigmoids), the copy changes
                # nothing of it.
                loss = lambda *a: fn(*a).float().sum()   # noqa: E731
                compiled, graphs = self.compiled(loss)
                plain = aot_function(loss, lambda gm, _: gm, lambda gm, _: gm, partition_fn=default_partition)
                args = [torch.randn(*s, generator=self.gen).to(torch.bfloat16).requires_grad_() for s in shapes]
                results = []
                for f in (compiled, plain):
                    for a in args:
                        a.grad = None
                    out = f(*args)
                    out.backward()
                    results.append((out, [a.grad.clone() for a in args]))
                (got, grads), (want, wanted) = results
                self.assertTrue(torch.equal(got, want), (got, want))
                for g, w in zip(grads, wanted):
                    self.assertTrue(torch.equal(g, w))
                act = "aten.silu.default" if name == "swiglu" else "aten.gelu.default"
                saved = [str(n.target) for n in _saved(graphs["forward"])]
                if name == "swiglu":
                    self.assertNotIn(act, saved)
                    self.assertIn(act, _targets(graphs["backward"]))
                else:
                    self.assertIn(act, saved)
                    self.assertNotIn(act, _targets(graphs["backward"]))

    def cross_entropy_split_by(self, partition_fn):
        """A cross-entropy's forward and backward, its joint graph split by
        partition_fn."""
        fn = aot_function(lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t, ignore_index=-1),
                          lambda gm, _: gm, lambda gm, _: gm, partition_fn=partition_fn)
        h, w, t = self.inputs()
        fn(h, w, t).backward()

    def loss_through(self, split, warning):
        """A cross-entropy's forward and backward through with_recompute(split),
        warning as `warning` says."""
        with self.assertWarnsRegex(UserWarning, warning):
            self.cross_entropy_split_by(_partition.with_recompute(split))

    def test_a_graph_the_rewrite_cannot_take_is_split_as_it_came(self):
        seen = []

        def split(joint_module, joint_inputs, **kwargs):
            seen.append(joint_module)
            return default_partition(joint_module, joint_inputs, **kwargs)
        real = _partition.recompute_for_backward
        _partition.recompute_for_backward = lambda graph, n=None: 1 / 0
        try:
            self.loss_through(split, "split as it came .ZeroDivisionError")
        finally:
            _partition.recompute_for_backward = real
        self.assertEqual(len(seen), 1)
        self.assertEqual([str(n.target) for n in seen[0].graph.nodes].count("aten._log_softmax.default"), 1)

    def test_a_rewritten_graph_the_split_cannot_take_is_split_as_it_came(self):
        # The split raises on the rewritten graph alone (seen on Llama: "Node
        # t_32 was invalid, but is output"); the graph as it came is split,
        # and the rewritten one kept where REGEN_COMPILE_DUMP says.
        seen = []

        def split(joint_module, joint_inputs, **kwargs):
            seen.append(joint_module)
            if len(seen) == 1:
                raise AssertionError("Node t_32 was invalid, but is output")
            return default_partition(joint_module, joint_inputs, **kwargs)
        with tempfile.TemporaryDirectory() as dump:
            os.environ["REGEN_COMPILE_DUMP"] = dump
            try:
                self.loss_through(split, "split as it came .AssertionError: Node t_32")
            finally:
                del os.environ["REGEN_COMPILE_DUMP"]
            kept = os.listdir(dump)
            self.assertEqual(kept, ["partition-failed-0.txt"])
            with open(os.path.join(dump, kept[0])) as f:
                self.assertIn("Node t_32 was invalid", f.readline())
                # each node's meta after the graph: what the split read
                self.assertRegex(f.read(), r"# each node's meta[\s\S]*\n_log_softmax_1: \{.*'tensor_meta': ")
        self.assertEqual(len(seen), 2)
        # The first was the rewritten graph (the log-softmax copied for the
        # backward), the second the graph as it came (one).
        count = [[str(n.target) for n in g.graph.nodes].count("aten._log_softmax.default") for g in seen]
        self.assertEqual(count, [2, 1])
        self.assertIsNot(seen[0], seen[1])

    def test_a_copy_for_the_backward_is_tagged_as_the_backwards(self):
        # torch 2.11's AOTAutograd tags each node of the joint graph with the
        # pass that traced it ("is_forward", "is_backward"), and its split
        # refused the rewritten graph while the copies kept their originals'
        # "is_forward" (Llama, H100), and takes every node up to the last
        # "is_forward" as the forward's. Tagged here as 2.11 tags them: the
        # backward's from the first node that reads a tangent on.
        seen = []

        def tagged(split):
            def tag_then_split(joint_module, joint_inputs, **kwargs):
                backward = False
                for n in joint_module.graph.nodes:
                    backward = backward or any(a.name.startswith("tangents") for a in n.all_input_nodes)
                    if n.op != "placeholder":
                        n.meta["partitioner_tag"] = "is_backward" if backward else "is_forward"
                return split(joint_module, joint_inputs, **kwargs)
            return tag_then_split

        def split(joint_module, joint_inputs, **kwargs):
            nodes = list(joint_module.graph.nodes)
            seen.append({n.name: (str(n.target), n.meta.get("partitioner_tag")) for n in nodes})
            # Every node the forward needs first, tagged so, then the
            # backward's: as torch 2.11's split reads the graph, by place.
            tags = [n.meta.get("partitioner_tag") for n in nodes if n.op == "call_function"]
            self.assertEqual(tags, sorted(tags, key=lambda t: t != "is_forward"))
            # The forward's log-softmax feeds its loss alone: autograd's
            # detaches of it for the backward read the copy.
            for n in nodes:
                if str(n.target) == "aten._log_softmax.default" and n.meta.get("partitioner_tag") == "is_forward":
                    self.assertEqual([str(u.target) for u in n.users], ["aten.nll_loss_forward.default"])
            return default_partition(joint_module, joint_inputs, **kwargs)
        self.cross_entropy_split_by(tagged(_partition.with_recompute(split)))
        self.assertEqual(len(seen), 1)
        softmaxes = sorted(tag for name, (target, tag) in seen[0].items() if target == "aten._log_softmax.default")
        # The forward's own, and the copy the backward reads.
        self.assertEqual(softmaxes, ["is_backward", "is_forward"])
        # The widening cast under the copy: copied, and tagged, too.
        casts = sorted(tag for name, (target, tag) in seen[0].items() if target == "aten._to_copy.default" and
                       tag == "is_forward")
        self.assertEqual(len(casts), 1)

    def test_the_pass_counts_what_it_copies(self):
        # Without num_fwd_outputs (torch before 2.0) and with it.
        for n in (None, 1):
            with self.subTest(num_fwd_outputs=n):
                self.check_pass_counts(n)

    def check_pass_counts(self, num_fwd_outputs):
        g = torch.fx.Graph()
        x = g.placeholder("x")
        t = g.placeholder("t")
        tangent = g.placeholder("tangents_1")
        aten = torch.ops.aten
        wide = g.call_function(aten._to_copy.default, (x,), {"dtype": torch.float32})
        ls = g.call_function(aten._log_softmax.default, (wide, 1, False))
        fwd = g.call_function(aten.nll_loss_forward.default, (ls, t, None, 1, -100))
        total = g.call_function(__import__("operator").getitem, (fwd, 1))
        gl = g.call_function(aten.nll_loss_backward.default, (tangent, ls, t, None, 1, -100, total))
        seen = g.call_function(aten.detach.default, (ls,))
        dx = g.call_function(aten._log_softmax_backward_data.default, (gl, seen, 1, torch.float32))
        g.output([fwd, dx])
        self.assertEqual(_partition.recompute_for_backward(g, num_fwd_outputs), 1)
        softmaxes = [n for n in g.nodes if n.target is aten._log_softmax.default]
        casts = [n for n in g.nodes if n.target is aten._to_copy.default]
        self.assertEqual((len(softmaxes), len(casts)), (2, 2))
        # The forward's reader keeps the first, the backward's read the copy
        # (through its detach), made from the same input.
        self.assertEqual(list(softmaxes[0].users), [fwd])
        self.assertEqual(set(softmaxes[1].users), {gl, seen})
        self.assertIs(casts[1].args[0], x)
        order = list(g.nodes)
        self.assertLess(order.index(softmaxes[1]), order.index(gl))
        self.assertEqual(_partition.recompute_for_backward(g, num_fwd_outputs), 0)


if __name__ == "__main__":
    unittest.main()
