# SPDX-License-Identifier: Apache-2.0
"""Optimizers whose step is one io.regen.Program Run over every parameter.

    opt = regen.torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    loss.backward(); opt.step(); opt.zero_grad()

A drop-in for torch.optim.AdamW (the same update, decoupled weight decay,
no amsgrad): the state (exp_avg, exp_avg_sq, step) is the rank's tensors,
in ``opt.state`` as torch keeps them, so state_dict() and load_state_dict()
work as torch's; the update runs in regend as one program Run (a multi-
tensor AdamW node per parameter), with a journal.  Learning rates may
change between steps (schedulers): each group's lr and step count are
scalars of the Run, not of the definition.

The journal (proto/program_journal.h), by ``journal=``:

- "copy" (the default): it holds the parameters and moments as they were
  before each Run, copied on the device first, so that a Run a fault of
  regend's interrupts is applied exactly once after the new generation:
  never twice, never half.  The state is on the device twice, and each
  step copies it;
- "marks": it holds the Run's marks alone (32 bytes; no copy, no second
  state).  A Run a fault of regend's cuts before it began is retried as
  with copies; one cut after it began cannot be, and opt.step() raises
  regen.torch.Torn (load a checkpoint).  A rank that dies never cuts a Run
  (regend finishes it, or never starts it), so regen.torch.keep() resumes
  a killed rank from the step after the commit where that step's Run
  completed.

The Runs on the journal are numbered by the optimizer (its ``journal_seq``,
the Runs it made), so that regen.torch.keep() reads from the journal's
header which step the kept memory holds, and puts back a step its process
died after and never committed (copy), or resumes from it (marks)
(docs/torch.md, "Kept state").
"""

import itertools
import weakref

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

_serials = itertools.count(1)
__all__ = ["AdamW"]

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class AdamW(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, journal: str = "copy") -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if journal not in ("copy", "marks"):
            raise ValueError(f"journal={journal!r}: \"copy\" (the parameters and moments saved before each Run) or "
                             "\"marks\" (the Run's marks only)")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._journal = None
        self.journal_mode = journal
        # The Runs made on the journal (each Run's seq is one more); where
        # the Run to come (then the last one) saves each inout: [(tensor,
        # offset, bytes)] (none with marks only); the values of opt.state
        # it advances by one once it completed: [(parameter, key)]; what
        # is called with the optimizer before each Run, once these say the
        # Run to come (regen.torch.keep records them there when they
        # change).
        self.journal_seq = 0
        self.journal_layout: List[Any] = []
        self.journal_advances: List[Any] = []
        self.before_run: List[Callable[..., Any]] = []
        self._layouts: Dict[Any, Any] = {}
        self._definitions: Dict[Any, Any] = {}   # the parameters' layout and constants -> the program's definition
        self._serial = next(_serials)
        from ._compile import forget_programs
        weakref.finalize(self, forget_programs, self._serial, "optimizer")

    def _definition(self, groups):
        """The program for these groups' parameters (shapes, dtypes) and
        constant hyperparameters; lr and step are scalars of each Run."""
        import regen
        b = regen.ProgramBuilder("adamw")
        for gi, (group, params) in enumerate(groups):
            lr, step = b.scalar(f"lr{gi}"), b.scalar(f"step{gi}")
            beta1, beta2 = group["betas"]
            for pi, p in enumerate(params):
                dt = _DTYPES.get(p.dtype)
                if dt is None:
                    raise TypeError(f"regen.torch.optim.AdamW: parameters of {p.dtype} (f32, f16, bf16 only)")
                name = f"{gi}_{pi}"
                w = b.inout(f"p{name}", dt, p.shape, p.stride())
                g = b.input(f"g{name}", _DTYPES[p.grad.dtype], p.shape, p.grad.stride())
                st = self.state[p]
                m = b.inout(f"m{name}", _DTYPES[st["exp_avg"].dtype], p.shape, st["exp_avg"].stride())
                v = b.inout(f"v{name}", _DTYPES[st["exp_avg_sq"].dtype], p.shape, st["exp_avg_sq"].stride())
                b.node("adamw", [w, g, m, v], [], lr=lr, step=step, beta1=float(beta1), beta2=float(beta2),
                       eps=float(group["eps"]), weight_decay=float(group["weight_decay"]))
        return b.definition()

    def _journal_for(self, program):
        """The rank's buffer a Run marks (and, with copies, a retried Run
        puts the parameters back from): on the parameters' device (the host
        pool on the CPU), grown as needed."""
        from ..program import JOURNAL_MARKS_BYTES
        need = JOURNAL_MARKS_BYTES if self.journal_mode == "marks" else max(program.journal_bytes, 8)
        j = self._journal
        if j is None or j.numel() < need or j.device != self._device:
            if self._device.type == "cpu":
                from ._runtime import host_empty
                j = host_empty([need], torch.uint8)
            else:
                j = torch.empty(need, dtype=torch.uint8, device=self._device)
            self._journal = j
        return j

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups: List[Any] = []
        tensors: Dict[str, torch.Tensor] = {}
        scalars: Dict[str, float] = {}
        key: Any = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            gi = len(groups)
            groups.append((group, params))
            steps = set()
            for pi, p in enumerate(params):
                if p.grad.is_sparse:
                    raise RuntimeError("regen.torch.optim.AdamW does not support sparse gradients")
                st = self.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0)
                    st["exp_avg"] = _zeros_like(p)
                    st["exp_avg_sq"] = _zeros_like(p)
                steps.add(float(st["step"]))
                name = f"{gi}_{pi}"
                tensors[f"p{name}"], tensors[f"g{name}"] = p, p.grad
                tensors[f"m{name}"], tensors[f"v{name}"] = st["exp_avg"], st["exp_avg_sq"]
                key.append((tuple(p.shape), tuple(p.stride()), p.dtype, p.grad.dtype, tuple(p.grad.stride())))
            if len(steps) != 1:
                raise RuntimeError("regen.torch.optim.AdamW: a group's parameters have taken different numbers of "
                                   "steps (one Run steps them together)")
            scalars[f"lr{gi}"] = float(group["lr"])
            scalars[f"step{gi}"] = steps.pop() + 1
            key.append((group["betas"], group["eps"], group["weight_decay"], len(params)))
        if not groups:
            return loss
        self._device = groups[0][1][0].device
        key = (("optimizer", self._serial), tuple(key))
        definition = self._definitions.get(key)
        if definition is None:
            definition = self._definitions[key] = self._definition(groups)
        from . import runtime
        layout = self._layouts.get(key)
        if layout is None:
            from ..keep import journal_layout
            layout = self._layouts[key] = journal_layout(definition) if self.journal_mode == "copy" else {}
        self.journal_layout = [(tensors[name], offset, nbytes) for name, (offset, nbytes) in layout.items()]
        self.journal_advances = [(p, "step") for _, params in groups for p in params]
        for f in self.before_run:
            f(self)
        seq = self.journal_seq + 1
        runtime().run_program(key, definition, tensors, scalars, journal=self._journal_for, seq=seq,
                              journal_mode=self.journal_mode)
        self.journal_seq = seq
        for group, params in groups:
            for p in params:
                self.state[p]["step"] += 1
        return loss


def _zeros_like(p):
    if p.device.type == "cpu":
        from ._runtime import host_empty
        return host_empty(list(p.shape), p.dtype).zero_()
    return torch.zeros_like(p, memory_format=torch.preserve_format)
