"""catchat's model and training step in PyTorch: the program half of the speedrun's PyTorch row
(catchat/analysis/torch_train.py runs the loop). torch is imported only inside functions.

`TorchProgram` offers what catchat's trainer, `evaluate_lanes` and the time budget's eval probe ask of
a `catchat.vk.program.Program` (`evaluate_windows`, `get_carry` / `set_carry`, `get_params` /
`set_params`) plus a training step, on `torch_twin.torch_model`'s modules (an nn.GRU per layer, nn.RMSNorm,
a bias-free head), as a PyTorch user would run them:
- the forward of docs/model.md exactly: embedding times sqrt(H), per layer GRU + residual + RMSNorm, the
  head (tied: the embedding's weight); the carried state [L, B, H] enters each window, detached
  (truncated BPTT), and is zeroed where a conversation starts. cuDNN's GRU cannot reset a lane's state
  inside a sequence, so a window is run in segments cut at every step where some lane resets
  (`reset_segments`), each lane's state multiplied by 1 - reset there: the same arithmetic, more calls.
- dropout draws catchat's own masks (the reference's `dropout_scales`): whole embedding rows per micro-batch and
  a variational [B, H] mask per layer on the GRU's output, from `step_seed(train.seed, step, k)`.
- the loss: cross_entropy(label_smoothing) summed over the valid targets (<pad> masked) of the micro-batch,
  divided by the whole step's valid count; gradients of the step's micro-batches summed.
- clip_grad_norm_ (PyTorch's formula is catchat's), a step skipped when its norm is not finite or it has
  no valid targets (the optimizer's t does not move), then torch.optim.NAdam(decoupled_weight_decay=True)
  or AdamW with weight decay only on the matrices and the embedding (docs/model.md's table), the lr set
  per step. NAdam has no fused kernel in PyTorch: foreach on CUDA (the nearest); AdamW is fused there.
- AMP: autocast to bf16 around the forward and the loss (cuDNN's GRU runs in bf16, the weights, grads and
  optimizer stay float32, no loss scaling; the state a window hands the next is the GRU's bf16 output);
  evals always run in float32 (the trainer turns TF32 off): the loss of the weights themselves.
"""

from __future__ import annotations

import math

import numpy as np

from catchat.data import vocab
from catchat.model import ParamLayout


def reset_segments(resets: np.ndarray) -> list[tuple[int, int]]:
    """[(a, b)]: the window's steps [0, T) cut before every step t >= 1 where some lane's state is reset
    (resets [T, B]); step 0's resets apply to the carried state itself. cuDNN runs each segment whole."""
    T = resets.shape[0]
    cuts = [0, *(int(t) for t in np.flatnonzero(np.asarray(resets)[1:].any(axis=1)) + 1), T]
    return list(zip(cuts[:-1], cuts[1:]))


def torch_name(name: str) -> str:
    """catchat's parameter name (docs/model.md) -> the attribute path in torch_twin.torch_model's module."""
    if name in ("embedding.weight", "head.weight"):
        return "emb.weight" if name == "embedding.weight" else name
    _, l, kind, which = name.split(".")  # layers.{l}.gru.weight_ih / layers.{l}.norm.weight
    return f"norms.{l}.weight" if kind == "norm" else f"grus.{l}.{which}_l0"


class TorchProgram:
    """The model on `device` in `dtype` (float32; float64 for the tests' checks against the numpy
    reference), B lanes. amp: autocast bf16 around the training forward and loss (CUDA)."""

    def __init__(self, cfg, layout: ParamLayout, B: int, device: str = "cpu", *, amp: bool = False, dtype=None):
        import torch

        from catchat.analysis.torch_twin import torch_model

        self.torch, self.cfg, self.layout, self.B = torch, cfg, layout, B
        self.dev = torch.device(device)
        self.amp = amp
        spec = layout.spec
        self.model = torch_model(spec, self.dev).to(dtype or torch.float32)
        if spec.tie_embeddings:  # the head multiplies by the embedding's own weight
            self.model.head.weight = self.model.emb.weight
        named = dict(self.model.named_parameters())
        self.params = {n: named[torch_name(n)] for n in layout.names}  # catchat's names, in layout order
        self.dtype = self.model.emb.weight.dtype
        self.carry = torch.zeros(spec.layers, B, spec.hidden, device=self.dev, dtype=self.dtype)
        self.opt = self._optimizer()
        self.vocab_ids = torch.arange(spec.vocab_size, device=self.dev)

    def _optimizer(self):
        t, torch = self.cfg.train, self.torch
        decay = [self.params[s.name] for s in self.layout.specs if s.decay]
        rest = [self.params[s.name] for s in self.layout.specs if not s.decay]
        groups = [dict(params=decay, weight_decay=t.weight_decay), dict(params=rest, weight_decay=0.0)]
        cuda = self.dev.type == "cuda"
        if t.optimizer == "nadam":
            return torch.optim.NAdam(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, momentum_decay=0.004,
                                     decoupled_weight_decay=True, foreach=cuda or None)
        return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, fused=cuda or None)

    # ------------------------------------------------------------------ weights and state
    def set_params(self, flat: np.ndarray) -> None:
        """Load flat parameters in catchat's layout (e.g. init_params, a checkpoint)."""
        with self.torch.no_grad():
            for name, arr in self.layout.unflatten(np.asarray(flat)).items():
                self.params[name].copy_(self.torch.from_numpy(np.ascontiguousarray(arr)))

    def get_params(self, dtype=np.float32) -> np.ndarray:
        """The parameters in catchat's flat layout (catchat's reference and evals read it)."""
        return self.layout.flatten({n: p.detach().cpu().numpy() for n, p in self.params.items()}, dtype)

    def get_carry(self) -> np.ndarray:
        return self.carry.detach().cpu().numpy()  # [L,B,H]

    def set_carry(self, carry: np.ndarray | None) -> None:
        """The carried state [L, B, H] (None: zeros)."""
        if carry is None:
            self.carry = self.torch.zeros_like(self.carry)
        else:
            self.carry = self.torch.as_tensor(np.asarray(carry), device=self.dev, dtype=self.dtype)

    def _tensor(self, a: np.ndarray, dtype):
        """A host array on the device as `dtype`, converted on the host (uint32 has few CUDA kernels)."""
        host = np.ascontiguousarray(a, dtype=self.torch.empty(0, dtype=dtype).numpy().dtype)
        return self.torch.from_numpy(host).to(self.dev, non_blocking=True)

    # ------------------------------------------------------------------ the model
    def forward(self, tokens: np.ndarray, resets: np.ndarray, h0, row_scale=None, hid_scale=None):
        """Logits [T, B, V] and the states after the window [L, B, H] (the graph kept: backward through
        them is the caller's). tokens, resets [T, B] numpy; h0 [L, B, H] tensor; row_scale [V] and
        hid_scale [L, B, H] numpy (None: no dropout)."""
        torch = self.torch
        m, H = self.model, self.layout.spec.hidden
        tok = self._tensor(tokens, torch.int64)  # [T,B]
        keep = 1.0 - self._tensor(resets, self.dtype)  # [T,B]
        rows = (self._tensor(row_scale, self.dtype) if row_scale is not None
                else torch.full((self.layout.spec.vocab_size,), math.sqrt(H), device=self.dev, dtype=self.dtype))
        x = torch.nn.functional.embedding(tok, m.emb.weight) * rows[tok].unsqueeze(-1)  # [T,B,H]
        hid = None if hid_scale is None else self._tensor(hid_scale, self.dtype)  # [L,B,H]
        segments = reset_segments(resets)
        states = []
        for l, (gru, norm) in enumerate(zip(m.grus, m.norms)):
            h, outs = h0[l], []
            for a, b in segments:
                h = h * keep[a].unsqueeze(-1)  # [B,H] zero where a conversation starts at a
                o, hT = gru(x[a:b], h.unsqueeze(0))
                outs.append(o)
                h = hT[0]
            o = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T,B,H]
            states.append(h)
            x = norm(x + (o if hid is None else o * hid[l]))
        return m.head(x), torch.stack(states)

    # ------------------------------------------------------------------ one optimizer step
    def train_step(self, batches: list, *, lr: float, n_valid: int, while_running=None) -> dict:
        """One optimizer step over `batches` [(tokens, targets, resets, row_scale, hid_scale)], the state
        carried through them. Returns loss (the step's, smoothed as trained), grad_norm (before
        clipping), clipped and skipped. `while_running` is called once the backward is queued."""
        torch, t = self.torch, self.cfg.train
        V = self.layout.spec.vocab_size
        self.opt.zero_grad(set_to_none=True)
        h = self.carry
        losses = []
        for tokens, targets, resets, row_scale, hid_scale in batches:
            with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.amp):
                logits, states = self.forward(tokens, resets, h, row_scale, hid_scale)
                loss = torch.nn.functional.cross_entropy(
                    logits.to(self.dtype).reshape(-1, V), self._tensor(targets, torch.int64).reshape(-1),
                    ignore_index=vocab.PAD, label_smoothing=t.label_smoothing, reduction="sum") / max(n_valid, 1)
            loss.backward()
            losses.append(loss.detach())
            h = states.detach().to(self.dtype)
        self.carry = h
        params = list(self.params.values())
        norm = torch.nn.utils.clip_grad_norm_(params, t.clip if t.clip > 0 else math.inf)
        if while_running is not None:
            while_running()
        grad_norm = float(norm)
        skipped = n_valid == 0 or not math.isfinite(grad_norm)
        if not skipped:
            for group in self.opt.param_groups:
                group["lr"] = lr
            self.opt.step()
        clipped = bool(t.clip > 0 and not skipped and t.clip / (grad_norm + 1e-6) < 1.0)
        return dict(loss=float(torch.stack(losses).sum()), grad_norm=grad_norm, clipped=clipped, skipped=skipped)

    # ------------------------------------------------------------------ evaluation
    def evaluate_windows(self, windows, *, free_running: bool = False, reduce_sums=None) -> dict:
        """Program.evaluate_windows: plain cross-entropy over windows [(tokens, targets, resets)] in order,
        the state carried from zero, float32 without autocast; loss (nats/char), bpc, top-1/top-5 rates
        (ranks with ties to the lower index, as catchat's), n_valid, windows. Leaves the carry where the
        windows end, as catchat's does (evaluate_lanes restores it)."""
        if free_running or reduce_sums is not None:
            raise NotImplementedError("the PyTorch row scores teacher-forced on one process only")
        torch = self.torch
        V = self.layout.spec.vocab_size
        sums = torch.zeros(4, dtype=torch.float64, device=self.dev)  # loss sum, valid, top-1, top-5
        h = torch.zeros_like(self.carry)
        count = 0
        with torch.no_grad():
            for tokens, targets, resets in windows:
                logits, h = self.forward(tokens, resets, h)
                lg = logits.to(self.dtype).reshape(-1, V)  # [T*B,V]
                tgt = self._tensor(targets, torch.int64).reshape(-1)  # [T*B]
                valid = tgt != vocab.PAD
                ce = torch.nn.functional.cross_entropy(lg, tgt, ignore_index=vocab.PAD, reduction="none")
                lt = lg.gather(1, tgt[:, None])  # [T*B,1]
                rank = ((lg > lt) | ((lg == lt) & (self.vocab_ids < tgt[:, None]))).sum(1)  # [T*B]
                sums += torch.stack([ce.double().sum(), valid.sum().double(), (valid & (rank < 1)).sum().double(),
                                     (valid & (rank < 5)).sum().double()])
                count += 1
        self.carry = h
        loss_sum, n, top1, top5 = (float(s) for s in sums.cpu())
        loss = loss_sum / n if n else float("nan")
        return dict(loss=loss, bpc=loss / math.log(2.0), top1=top1 / max(n, 1), top5=top5 / max(n, 1),
                    n_valid=int(n), windows=count)

    def sample(self, chars: int, temperature: float, seed: int) -> str:
        """`chars` characters from <bos> at `temperature` (0: greedy), <pad> and <bos> never chosen, ended
        early by <eos>: the eval's samples (torch's sampler, not catchat's draws)."""
        torch = self.torch
        spec = self.layout.spec
        gen = torch.Generator(device=self.dev).manual_seed(seed)
        hs = [torch.zeros(1, 1, spec.hidden, device=self.dev, dtype=self.dtype) for _ in range(spec.layers)]
        tok = torch.tensor([vocab.BOS], device=self.dev)
        out = []
        with torch.no_grad():
            for _ in range(chars):
                logits, hs = self.model.step(tok, hs)  # [1,V]
                logits[:, [vocab.PAD, vocab.BOS]] = -math.inf
                if temperature <= 0:
                    tok = logits.argmax(-1)
                else:
                    tok = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=gen)[:, 0]
                out.append(int(tok))
                if out[-1] == vocab.EOS:
                    break
        return vocab.decode(out, show_specials=False)
