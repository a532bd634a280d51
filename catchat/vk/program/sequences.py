"""The recorded sequences: op lists in dispatch order, and the kp sequences built from them once
and replayed for every batch (never re-recorded).

    eval                   upload hyper/stats/data; forward; plain cross-entropy + loss reduction; carry
    logits                 upload hyper/stats/data; forward; carry; download logits and stats
    set params             upload params; rebuild table0
    micro-batch (first)    upload hyper/stats/data; zero grads; forward; loss (dlogits in place); backward; carry
    micro-batch (next)     the same without zeroing and the stats upload (gradient accumulation)
    ... in groups          several ranks: the last micro-batch as one sequence per backward group, each
                           ending with its gradient range copied out and downloaded (grad_slices.py)
    apply                  (fp16: grads *= 1/S); grad norm; skip guard + clip + AdamW/NAdam; spectral projection;
                           table0; download stats
    per-timestep           recorded on first use: eval (free-running) and the two micro-batches with the
                           forward one timestep at a time (scheduled sampling); the backward is the same
    decode start           upload the call's settings; carry -> decode state; first choice; download it
    decode chunk (x2)      K steps of every layer, the head, the choice (fused, or the batched forward at T = 1:
                           decoder.py); the next input fed back on the device; decode state -> carry;
                           download the K chosen tokens (two, for overlap)
Values that change every step travel in the `hyper` buffer uploaded with the data.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from catchat.vk.device import Device
from catchat.vk.program.grad_slices import GradStages
from catchat.vk.program.kernelsets import BackwardKernels, ForwardKernels, StepwiseKernels
from catchat.vk.program.plan import Buffers

Sequence = Any  # a recorded kp sequence


# ----------------------------------------------------------------------------- op lists
def forward_ops(f: ForwardKernels) -> list:
    """Embedding, every layer (input projection, recurrent sweep, residual+norm), head."""
    r = f.rows
    ops = [r.embedding.op()]
    for proj, gru, norm in zip(r.proj, f.gru, r.norm):
        ops += proj.ops() + gru.sweep_ops() + norm.ops()
    return ops + r.head.ops()


def side_by_side(dev, groups: list[list]) -> list:
    """The groups' ops in order, each group's first dispatch recorded without the barrier before it
    (`Device.beside`): groups that neither read nor write what another writes may run at once; the
    next dispatch recorded with its barrier waits for all of them."""
    ops = list(groups[0])
    for group in groups[1:]:
        ops += [dev.beside(group[0])] + list(group[1:])
    return ops


def dw_hh_beside(k: BackwardKernels, l: int) -> bool:
    """Whether layer l's dW_hh GEMM is recorded beside layer l-1's backward sweep: `k.overlap_dw_hh`
    (its split-K partials in ws) and that sweep one persistent dispatch."""
    return k.overlap_dw_hh and l > 0 and bool(k.layers[l - 1].gru.sweep_workgroups)


def backward_groups(k: BackwardKernels, dev: Device | None = None) -> list[list]:
    """The backward in groups, in order: the head with the top layer, each layer below (norm,
    recurrent sweep, batched weight gradients), then layer 0 in two: its norm and sweep with the
    embedding and table0 (finishing the embedding and W_ih0, the flat layout's head), then its W_hh
    and bias gradients. Layer 0's own GEMMs go last so that the range exchanged after the GPU has
    finished is half a layer, not a layer and the embedding. Group g finishes the gradient's range
    grad_slices.group_ranges(layout)[g]. With dev and `k.overlap_dw_hh` (the one-sequence backward,
    `backward_ops`), each layer's dW_hh GEMM moves beside the persistent backward sweep of the layer
    below, which runs while it does (that sweep's group then finishes it: no group ranges then)."""
    def beside_below(l: int) -> bool:  # layer l's dW_hh runs beside layer l-1's sweep
        return dev is not None and dw_hh_beside(k, l)

    def weight_grads(l: int) -> list:
        lay = k.layers[l]
        gemms = [g for g in lay.weight_grad_gemms() if not (g is lay.dw_hh and beside_below(l))]
        return [op for gemm in gemms for op in gemm.ops()] + lay.bias_grad_ops()

    def sweep(l: int) -> list:  # layer l's backward sweep, and layer l+1's dW_hh beside it
        ops = k.layers[l].gru.sweep_ops()
        if l + 1 < len(k.layers) and beside_below(l + 1):
            return side_by_side(dev, [ops, k.layers[l + 1].dw_hh.ops()])
        return ops

    L = len(k.layers)
    groups = [k.layers[l].norm.ops() + sweep(l) + weight_grads(l) + k.layers[l].dx.ops() for l in range(L - 1, 0, -1)]
    t0, lay0 = k.table0, k.layers[0]
    groups.append(lay0.norm.ops() + sweep(0) + k.token_sum_ops() + t0.dw_ih.ops() + t0.demb.ops())
    groups.append(weight_grads(0))
    groups[0] = k.head_dx.ops() + k.head_dw.ops() + groups[0]
    return groups


def backward_ops(k: BackwardKernels, dev: Device | None = None) -> list:
    """The whole backward: its groups one after another (with dev: each dW_hh beside the sweep below
    where `k.overlap_dw_hh`)."""
    return [op for group in backward_groups(k, dev) for op in group]


def stepwise_forward_ops(f: ForwardKernels, s: StepwiseKernels, T: int, B: int) -> list:
    """The forward pass one timestep at a time: choose the input (scheduled sampling), embed it,
    run every layer's projection, recurrent step and norm on that row block, then the head."""
    r, ops = s.rows, []
    for t in range(T):
        row = t * B  # every row-block kernel moves to this timestep's rows
        ops += [s.tf_select.step(t), r.embedding.op_at(row)]
        for proj, gru, norm in zip(r.proj, f.gru, r.norm):
            ops += [proj.op_at(row), *gru.step_ops(t), norm.op_at(row)]
        ops.append(r.head.op_at(row))
    return ops


def optimizer_groups(f: ForwardKernels, k: BackwardKernels) -> list[tuple[str, list]]:
    """The optimizer's submit as (name, ops) groups, in order: (fp16: the unscale by 1/S), the grad norm,
    the update (skip guard, clip, AdamW/NAdam), the spectral projection, then what follows the
    parameters (table0, the streamed sweeps' float16 W_hh); a group with no dispatch left out."""
    groups = [("unscale (fp16)", [u(0.0, 0.0) for u in k.unscale]), ("grad norm", k.grad_norm()),
              ("optimizer update", [k.optimizer()]), ("spectral projection", k.spectral()),
              ("table0 and W_hh copies", f.derived_ops())]
    return [(name, ops) for name, ops in groups if ops]


def optimizer_ops(f: ForwardKernels, k: BackwardKernels) -> list:
    """`optimizer_groups`' dispatches, in order."""
    return [op for _, ops in optimizer_groups(f, k) for op in ops]


# ----------------------------------------------------------------------------- sequences
class ForwardSequences(NamedTuple):
    eval: Sequence
    logits: Sequence
    set_params: Sequence


class TrainSequences(NamedTuple):
    first: Sequence
    next: Sequence


def _data(b: Buffers) -> list:
    return [b.tokens, b.targets, b.resets]


def record_eval(dev: Device, b: Buffers, f: ForwardKernels, fwd: list) -> Sequence:
    """An eval sequence around the forward ops `fwd` (batched, or per-timestep: free-running)."""
    return dev.recorded(fwd + [f.cross_entropy.op(), f.loss_reduce.op(), f.carry(1.0, 0.0)],
                        [b.hyper, b.stats] + _data(b), [b.stats])


def record_forward(dev: Device, b: Buffers, f: ForwardKernels, fwd: list) -> ForwardSequences:
    """The forward-only sequences around the batched forward ops `fwd` (forward_ops)."""
    return ForwardSequences(
        eval=record_eval(dev, b, f, fwd),
        logits=dev.recorded(fwd + [f.carry(1.0, 0.0)], [b.hyper, b.stats] + _data(b), [b.logits, b.stats]),
        set_params=dev.recorded(f.derived_ops(), [b.params]))  # table0 (and w16) follow the params


def record_train(dev: Device, b: Buffers, f: ForwardKernels, k: BackwardKernels, fwd: list,
                 bwd: list | None = None) -> TrainSequences:
    """The first and next micro-batch around the forward ops `fwd` (batched or per-timestep) and the
    backward's `bwd` (default `backward_ops`; the wavefront's: wavefront.py)."""
    bwd = backward_ops(k, dev) if bwd is None else bwd
    micro = fwd + [k.cross_entropy.op(), f.loss_reduce.op()] + bwd + [f.carry(1.0, 0.0)]
    return TrainSequences(first=dev.recorded([k.zero_grads(0.0, 0.0)] + micro, [b.hyper, b.stats] + _data(b)),
                          next=dev.recorded(micro, [b.hyper] + _data(b)))


def record_train_groups(dev: Device, b: Buffers, f: ForwardKernels, k: BackwardKernels, fwd: list,
                        stages: GradStages) -> TrainSequences:
    """The first and next micro-batch around the forward ops `fwd` as one sequence per backward group
    (several ranks: the exchange overlaps the backward, docs/distributed.md): the forward and loss
    join the first group, the carry the last; each ends with its gradient range copied into its
    staging tensor and downloaded. The groups after the first are the same for both."""
    groups = backward_groups(k)
    groups[0] = fwd + [k.cross_entropy.op(), f.loss_reduce.op()] + groups[0]
    groups[-1] = groups[-1] + [f.carry(1.0, 0.0)]
    ends = [[copy.op()] for copy in stages.copies]
    rest = [dev.recorded(ops + end, (), [stage]) for ops, end, stage in zip(groups[1:], ends[1:], stages.stages[1:])]
    first = dev.recorded([k.zero_grads(0.0, 0.0)] + groups[0] + ends[0], [b.hyper, b.stats] + _data(b),
                         [stages.stages[0]])
    return TrainSequences(first=[first] + rest,
                          next=[dev.recorded(groups[0] + ends[0], [b.hyper] + _data(b), [stages.stages[0]])] + rest)


def record_apply(dev: Device, b: Buffers, f: ForwardKernels, k: BackwardKernels) -> Sequence:
    return dev.recorded(optimizer_ops(f, k), [], [b.stats])


# ----------------------------------------------------------------------------- decode
def record_decode_chunk(dev: Device, ops: list, K: int, end_ops: list, download: list) -> Sequence:
    """K decode steps (ops: their dispatches, step k's choice into row k of the chunk's output; K even:
    a ping-pong state ends in half 0, where the next chunk starts), then end_ops (the state copied to
    the Program's carry, so a batched prefill continues from it) and `download`."""
    if K < 2 or K % 2:
        raise ValueError(f"a decode chunk needs an even number of steps >= 2, got {K}")
    return dev.recorded(ops + end_ops, [], download)


def record_decode_start(dev: Device, upload: list, start_ops: list, sample, download: list) -> Sequence:
    """The start of a generation call: upload its settings, forced tokens and last logits, run
    start_ops (take the Program's carried state), and make the first choice (from the uploaded
    logits, or the first forced token)."""
    return dev.recorded(start_ops + [sample.choose(0)], upload, download)
