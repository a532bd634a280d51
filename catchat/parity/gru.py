"""GRU recurrent sweeps (glsl/gru_forward*.comp, glsl/gru_backward*.comp) against catchat.model.reference:
tiled and register-resident tiles at odd sizes, resets at t = 0 and mid-window, the BPTT clamp off
and on (hit count exact), one dispatch per step and persistent, dGh over save (the program's
layout) and in a buffer of its own; the GPU's dG also reproduce the reference's dW/db/dx through
the post-sweep GEMMs' numpy twin (dW_hh from the state buffer's hprev rows, resets applied)."""

from __future__ import annotations

import numpy as np

from catchat.model import ModelSpec, ParamLayout
from catchat.model import reference as ref
from catchat.parity import ParityResult, compare, make_hyper
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels import FragOrder, ToHalf, half_tensor, run_ops, unpack_half
from catchat.vk.kernels.gemm import coopmat_runs
from catchat.vk.kernels.gru import (
    BACKWARD_TILES,
    FORWARD_TILES,
    KSPLIT_ENV,
    GruBackward,
    GruForward,
    ResidentTiles,
    block_halves,
    device_sms,
    resident_backward,
    split_halves,
    state_rows,
    sweep_bias_sums,
    w16_blocked,
)
from catchat.vk.kernels.gru.stream import SPLIT_SCALE
from catchat.vk.program.wavefront import chunk_bounds
from catchat.vk.switches import env_override

FWD_ATOL, FWD_RTOL = 2e-6, 1e-5  # o, hprev, save: O(1) values, float32
BWD_ATOL, BWD_RTOL = 2e-6, 1e-5  # dGi, dGh, dh0: O(1) values after T steps of recursion
SAVE16_ATOL, SAVE16_RTOL = FWD_ATOL, 2.0**-10  # float16 saves: the float32 tolerance, or one half's ulp
# The float32 forward from float16 splits (split32): the tensor cores truncate their sums, ~7x float32's
# error in a product (tools/split16_error.py: 1.8e-6 of the largest |W_hh h| at v5's shape), so each step's
# products sit a few 1e-6 from the twin's at the cases' |gh| of ~1-3; the backward reads those saves.
# Emulated fragments (lavapipe) sum to nearest: there the float32 tolerances hold.
SPLIT_ATOL, SPLIT_RTOL = 1e-5, 2e-5


def make_case(T, B, H, seed=0, layer=1, wscale=2.0, xscale=1.0):
    """Inputs of one parity case: flat params (ParamLayout with 2 layers), gi, h0 [2,B,H], resets, do."""
    rng = np.random.default_rng(seed + 7919 * T + 104729 * H + B)
    layout = ParamLayout(ModelSpec(vocab_size=11, hidden=H, layers=2))
    flat = np.zeros(layout.total, np.float32)
    k = wscale / np.sqrt(H)  # larger than init so gates saturate somewhere
    for name in layout.names:
        layout.view(flat, name)[...] = rng.uniform(-k, k, layout.shapes[name])
    x = (xscale * rng.standard_normal((T, B, H))).astype(np.float32)
    h0 = (0.7 * rng.standard_normal((2, B, H))).astype(np.float32)
    resets = (rng.random((T, B)) < 0.2).astype(np.uint32)  # [T,B]
    resets[0, 0] = 1  # a reset at t = 0 ...
    if T > 2:
        resets[T // 2, B - 1] = 1  # ... and one inside the window
    do = rng.standard_normal((T, B, H)).astype(np.float32)
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    p = {n: layout.view(flat, f"layers.{layer}.gru.{n}") for n in names}
    gi = (x @ p["weight_ih"].T + p["bias_ih"]).astype(np.float32)  # [T,B,3H]: the GEMM's job
    return dict(layout=layout, flat=flat, p=p, x=x, h0=h0, resets=resets, do=do, gi=gi, layer=layer)


def whh_copies(dev: Device, whh: np.ndarray, w_off: int, split: bool, w_half: bool, coop: bool, w_frag: bool):
    """The float16 copies of W_hh a `run_gru_gpu` case reads: (w_off, the copy both sweeps read or None,
    the forward's offset, the forward's copy, the ops that put it in fragment order). split: W_hh's hi then
    lo, each blocked, 8 halves in; w_half: W_hh as float16 5 halves in (8 and blocked for the streamed
    sweeps, coop); w_frag: the forward's own copy, the blocks 256 halves in, in fragment order in place."""
    tw16 = None
    if split:
        w_off = 8
        hi, lo = (block_halves(w) if w16_blocked() else w for w in split_halves(whh))
        tw16 = half_tensor(dev, np.concatenate([np.zeros(w_off), hi.ravel(), lo.ravel()]))
    elif w_half:
        w_off, w = (8, block_halves(whh) if w16_blocked() else whh) if coop else (5, whh)
        tw16 = half_tensor(dev, np.concatenate([np.zeros(w_off), w.ravel()]))
    if not w_frag:
        return w_off, tw16, w_off, tw16, []
    blocks = block_halves(whh)
    fw_half = half_tensor(dev, np.concatenate([np.zeros(256), blocks.ravel()]))
    return w_off, tw16, 256, fw_half, FragOrder(dev, fw_half, blocks.size // 256, 256, 256, col=True).ops()


def run_gru_gpu(dev: Device, case, clamp: float = 0.0, tiles=(None, None), pad: int = 16,
                stats0: int = 5, persistent=(0, 0), repeat: int = 1, dgh_in_save: bool = True,
                w_half: bool = False, coop: bool = False, stream_f32: bool = False, save_half: bool = False,
                chunks: int = 1, split: bool = False, w_frag: bool = False, resident_split: bool = False):
    """Forward sweep, then backward sweep on the GPU, with the program's buffer layout; returns a
    dict of host arrays.

    The state sequence is one buffer of T+1 row blocks (hprev = rows [0, T), o = rows [1, T+1):
    plan.py); dGh is written over save's r, z, n (dgh_in_save, as the program does) or into a
    [T,B,3H] buffer of its own. tiles: (forward tiles, backward tiles), None = default_tiles;
    persistent: (forward, backward) workgroups of one-dispatch sweeps (0 = a dispatch per step);
    repeat: both sweeps recorded that many times (the grid barrier's words must be ready again
    each time; returned as `sync`; `tiles` are the sweeps' own). Every activation buffer carries `pad` leading floats
    (operands at nonzero offsets); h0/hT/dh0 live in [2,B,H] state buffers addressed at layer
    `case['layer']`; stats[ST_CLAMP_HITS] starts at stats0 (hits accumulate). o, save and hT are
    read after the last forward sweep, hprev (the resets applied in place) and the gradients after
    the last backward. w_half: both sweeps read W_hh from a float16 copy (at an odd offset, 5
    halves in), as HALF_W; compare with `expected_gru(half_weights(case))`. coop: both sweeps'
    products on tensor cores (COOP); compare with `expected_gru(case, recurrent="fp16")`. Both: the
    streamed sweeps (W_hh 8 halves in), compared as coop. stream_f32: the float32 streamed sweeps
    (W_hh in params), compared as the tiled ones. save_half (streamed only): the saves as float16 (pad
    halves in) and dGh's n third in a [T,B,H] buffer of its own; the returned save is the halves,
    and dGh is whole again (r and z from dGi), for `expected_gru(..., saves="fp16")`. chunks: each sweep
    recorded as that many pieces of the window (`steps_ops`: the layer wavefront's), the forward's in
    order and the backward's from the top chunk down. split: the forward streamed on tensor cores from
    float16 splits (W_hh's blocked hi and lo 8 halves in), the backward float32 streamed, as a float32
    program runs them under CATCHAT_STREAM32_SPLIT; compare with the fp32 twin (forced). resident_split: the
    forward register-resident on tensor cores from float16 splits of params' W_hh (CATCHAT_RESIDENT_SPLIT), the
    backward as the tiles say; compared as split. w_frag (streamed):
    the forward reads a copy of its own, 256 halves in, put in fragment order on the GPU (`FragOrder`) before
    it runs; the backward the blocked copy.
    """
    layout, layer = case["layout"], case["layer"]
    T, B, H = case["x"].shape
    w_off = layout.offsets[f"layers.{layer}.gru.weight_hh"]
    b_off = layout.offsets[f"layers.{layer}.gru.bias_hh"]
    st_off = layer * B * H  # layer l of an [L,B,H] state buffer
    f32 = lambda n: dev.tensor(pad + n)  # noqa: E731
    tgi = dev.tensor(np.concatenate([np.zeros(pad, np.float32), case["gi"].ravel()]))
    tp, th0 = dev.tensor(case["flat"]), dev.tensor(case["h0"])
    tres = dev.tensor(case["resets"], np.uint32)
    tseq, thT = f32((T + 1) * B * H), dev.tensor(2 * B * H)
    tsave = half_tensor(dev, np.zeros(pad + T * B * 4 * H)) if save_half else f32(T * B * 4 * H)
    tdo = dev.tensor(np.concatenate([np.zeros(pad, np.float32), case["do"].ravel()]))
    hyper = dev.tensor(make_hyper(0, gradh_clamp=clamp), np.uint32)
    stats = np.zeros(slots.ST_WORDS, np.uint32)
    stats[slots.ST_CLAMP_HITS] = stats0  # hits accumulate onto what is there
    tstats = dev.tensor(stats, np.uint32)
    tdgi, tdh0 = f32(T * B * 3 * H), dev.tensor(2 * B * H)
    tdgh = f32(T * B * H) if save_half else None if dgh_in_save else f32(T * B * 3 * H)
    o_off = pad + state_rows(B, H)
    w_off, tw16, fw_off, fw_half, frag_ops = whh_copies(dev, case["p"]["weight_hh"], w_off, split, w_half, coop,
                                                        w_frag)
    fwd = GruForward(dev, tgi, tp, th0, tres, tseq, tseq, tsave, thT, T=T, B=B, H=H, w_off=fw_off,
                     b_off=b_off, gi_off=pad, h0_off=st_off, o_off=o_off, hprev_off=pad, save_off=pad,
                     hT_off=st_off, tiles=tiles[0], stats=tstats, persistent=persistent[0], w_half=fw_half,
                     coop=coop or resident_split, stream_f32=stream_f32, save_half=save_half,
                     split=split or resident_split, w_frag=w_frag)
    bw_off, bw_half = (layout.offsets[f"layers.{layer}.gru.weight_hh"], None) if split else (w_off, tw16)
    bwd = GruBackward(dev, tdo, tsave, tseq, tres, tp, hyper, tdgi, tdgh, tdh0, tstats, T=T, B=B, H=H,
                      w_off=bw_off, do_off=pad, save_off=pad, hprev_off=pad, dgi_off=pad, dgh_off=pad,
                      dh0_off=st_off, tiles=tiles[1], persistent=persistent[1], w_half=bw_half, coop=coop,
                      stream_f32=stream_f32 or split, save_half=save_half, bias_sums=sweep_bias_sums())
    bounds = chunk_bounds(T, chunks)
    fwd_ops = [op for t0, t1 in bounds for op in fwd.steps_ops(t0, t1)]
    bwd_ops = [op for t0, t1 in reversed(bounds) for op in bwd.steps_ops(t0, t1)]
    seq, save, hT = run_ops(dev, [tgi, tp, th0, tres, tdo, hyper, tstats, tseq, tsave, thT, tdgi, tdh0]
                            + [t for t in (tdgh, tw16, fw_half if w_frag else None) if t is not None],
                            frag_ops + (fwd_ops + bwd_ops) * (repeat - 1) + fwd_ops, [tseq, tsave, thT])
    sums = [] if bwd.bias_sums is None else [bwd.bias_sums]
    outs = run_ops(dev, [], bwd_ops, [tseq, tsave if dgh_in_save and not save_half else tdgh, tdgi, tdh0,
                                      tstats, fwd.sync, bwd.sync] + sums)
    hp, dgh, dgi, dh0, st, sync_f, sync_b = outs[:7]
    # the sweep's bias sums [B, 6H] over the lanes: db_ih, db_hh (None where the sweep leaves them to ColSum)
    db = None if not sums else outs[7].reshape(B, 2, 3 * H).sum(axis=0, dtype=np.float64)
    if save_half:
        save = unpack_half(save, pad + T * B * 4 * H)[pad:].astype(np.float32).reshape(T, B, 4 * H)
        dgh = ref.whole_dgh(dgi[pad:].reshape(T, B, 3 * H), dgh[pad:].reshape(T, B, H))
    else:
        save = save[pad:].reshape(T, B, 4 * H)
        dgh = dgh[pad:].reshape(T, B, 4 * H)[..., :3 * H] if dgh_in_save else dgh[pad:].reshape(T, B, 3 * H)
    sl = np.s_[st_off:st_off + B * H]
    return dict(o=seq[o_off:].reshape(T, B, H), hprev=hp[pad:pad + T * B * H].reshape(T, B, H),
                save=save, hT=hT[sl].reshape(B, H), dgi=dgi[pad:].reshape(T, B, 3 * H), dgh=dgh,
                dh0=dh0[sl].reshape(B, H), hits=int(st[slots.ST_CLAMP_HITS]) - stats0, db=db,
                sync_timeouts=int(st[slots.ST_SYNC_TIMEOUTS]), sync=np.concatenate([sync_f, sync_b]),
                tiles=(fwd.tiles, bwd.tiles), ran_split="SPLIT" in fwd.defines)


def half_weights(case):
    """The case with its W_hh rounded to float16: what a sweep reading the float16 copy multiplies."""
    p = {**case["p"], "weight_hh": case["p"]["weight_hh"].astype(np.float16).astype(np.float32)}
    return {**case, "p": p}


def expected_gru(case, clamp: float = 0.0, recurrent: str = "fp32", forced=None, saves: str = "fp32"):
    """reference forward and backward sweep in float32 for one case (recurrent "fp16": the products
    h @ W_hh^T and dGh @ W_hh from float16 operands, as the tensor-core sweeps). forced: the GPU's
    (hprev, dgh), the operands its products rounded, multiplied in place of the twin's own: a float16
    rounding is a step function, so a float32 ulp between the tensor cores' sums and numpy's flips
    some roundings and the flips grow through the recurrence (~1e-4 after 6 steps); forced, what is
    left to compare is each step's arithmetic, at float32 tolerances. saves "fp16": the gates' saves
    rounded to float16 (the streamed sweeps' save_half); forced may then add the GPU's saves [T,B,4H]
    (hprev, dgh, saves), which the backward reads in place of the twin's (the same argument)."""
    p, layer = case["p"], case["layer"]
    o, cache = ref.gru_layer_forward(case["x"], case["h0"][layer], case["resets"], p["weight_ih"],
                                     p["weight_hh"], p["bias_ih"], p["bias_hh"], recurrent=recurrent,
                                     forced_h=None if forced is None else forced[0], saves=saves)
    save = np.concatenate([cache["r"], cache["z"], cache["n"], cache["ghn"]], axis=2)  # [T,B,4H]
    if forced is not None:
        cache["forced_dgh"] = forced[1]
        if len(forced) > 2:
            ref.force_saves(cache, forced[2])
    dgi, dgh, dh0, hits = ref.gru_sweep_backward(case["do"], cache, clamp or None)
    return dict(o=o, hprev=cache["hprev"], save=save, hT=o[-1], dgi=dgi, dgh=dgh, dh0=dh0, hits=hits), cache


AUTO = (None, None)
R, RB = ResidentTiles, resident_backward
CASES = [  # (T, B, H, (forward tiles, backward tiles), clamp); AUTO = default_tiles
    (1, 1, 1, AUTO, 0.0),
    (5, 3, 7, AUTO, 0.0),
    # register blocks, k-slices and k chunks that leave partial workgroups, chunks and slices
    (5, 3, 7, ((2, 2, 2, 3, 2, 8), (1, 2, 2, 2, 2, 8)), 0.05),
    (9, 4, 33, AUTO, 0.02),
    (9, 4, 33, ((4, 2, 3, 2, 3, 12), (2, 2, 3, 2, 3, 12)), 0.0),
    (6, 5, 64, AUTO, 0.0),
    (6, 5, 64, (FORWARD_TILES[0][0], BACKWARD_TILES[0][0]), 0.03),  # the big-GPU tiles
    (4, 3, 130, (FORWARD_TILES[1][0], BACKWARD_TILES[1][0]), 0.0),
    # register-resident forward (NU, TB, RU, KV, LB): shuffle levels transposed and plain, partial
    # k-slices, units and lanes; one slice (no shuffles) at H=7; fewer threads than gate outputs
    # and more lanes per tile than B at H=12. Backward (NU, TB, CPT, slices, LB): partial unit
    # tiles, slices and lane batches (TB=1, 5), one slice (no shuffles) at H=7, more elements than
    # threads (H=12), columns past H (H=33, 64, 130), transposed and plain shuffle levels
    (5, 3, 7, (R(2, 1, 1, 2, 1), RB(2, 1, 1, 1, 4)), 0.0),
    (7, 3, 12, (R(16, 4, 2, 2, 4), RB(16, 4, 1, 2, 4)), 0.0),
    (9, 4, 33, (R(4, 2, 2, 2, 2), RB(4, 2, 2, 4, 4)), 0.02),
    (6, 5, 64, (R(16, 4, 2, 2, 4), RB(16, 5, 4, 4, 8)), 0.0),
    (6, 5, 64, (R(4, 5, 1, 1, 5), RB(4, 5, 3, 8, 4)), 0.03),
    (4, 3, 130, (R(8, 2, 2, 2, 2), RB(8, 2, 4, 2, 4)), 0.0),
]


# Persistent sweeps (one dispatch, grid barrier between steps), several tiles per workgroup included
PERSISTENT_CASES = [
    (9, 4, 33, ((4, 2, 3, 2, 3, 12), (2, 2, 3, 2, 3, 12)), 0.02),
    (9, 4, 33, (R(4, 2, 2, 2, 2), RB(4, 2, 2, 4, 4)), 0.02),
    (7, 6, 96, (R(16, 2, 2, 2, 2), RB(16, 2, 4, 4, 8)), 0.0),
    (6, 5, 64, AUTO, 0.03),
    (4, 3, 130, AUTO, 0.0),
]


# W_hh from a float16 copy (HALF_W, the tiled shaders): partial tiles, the big-GPU tiles, AUTO (on a
# GPU where that would be register-resident, the tiled tables' choice instead), and persistent
HALF_W_CASES = [
    ((5, 3, 7, ((2, 2, 2, 3, 2, 8), (1, 2, 2, 2, 2, 8)), 0.05), 0),
    ((6, 5, 64, (FORWARD_TILES[0][0], BACKWARD_TILES[0][0]), 0.0), 0),
    ((4, 3, 130, AUTO, 0.0), 0),
    ((9, 4, 33, ((4, 2, 3, 2, 3, 12), (2, 2, 3, 2, 3, 12)), 0.02), 1),
]


# Both sweeps' products on tensor cores (COOP; emulated fragments where the device has none): 16 x 16
# resident tiles at H a multiple of 64 (whole k-groups), H = 72 (a partial k-fragment and n-fragment,
# k-groups of 2 with one short, a partial unit tile: the backward's bounded partial stores), lanes past B
# (B = 20: a partial lane tile); per-step and persistent; on a GPU also v3's H
COOP_TILES = (R(16, 16, 2, 2, 4), RB(16, 16, 2, 2, 8))
COOP_CASES = [
    ((5, 16, 64, COOP_TILES, 0.0), 0),
    ((7, 20, 72, COOP_TILES, 0.02), 0),
    ((7, 20, 72, COOP_TILES, 0.0), 1),
]
COOP_GPU_CASES = [
    ((6, 16, 512, COOP_TILES, 0.0), 0),
    ((6, 32, 512, COOP_TILES, 0.0), 1),
]
# The register-resident float32 forward from float16 splits (rsplit32: COOP with SPLIT), the backward on
# the FMAs' resident tiles: the COOP cases' shapes (v3's on a GPU; H = 512 is where its shared memory is largest)
RSPLIT_TILES = (COOP_TILES[0], RB(16, 16, 2, 2, 8))
RSPLIT_CASES = [((T, B, H, RSPLIT_TILES, clamp), n) for (T, B, H, _, clamp), n in COOP_CASES]
RSPLIT_GPU_CASES = [((T, B, H, RSPLIT_TILES, clamp), n) for (T, B, H, _, clamp), n in COOP_GPU_CASES]


# The streamed sweeps (coop with a float16 W_hh: stream.py; emulated fragments where the device has no
# cooperative matrices): one lane fragment and two with lanes past B (B = 17, 20), two lane groups
# (B = 40), k-groups full (H = 128: FULL), left empty (H = 32) and short (H = 48), per-step and
# persistent, clamp off and on; on a GPU also v5's B and H, and v3's.
STREAM_CASES = [
    ((3, 3, 128, AUTO, 0.0), 0),
    ((4, 17, 48, AUTO, 0.02), 0),
    ((4, 20, 32, AUTO, 0.03), 1),
    ((3, 40, 32, AUTO, 0.02), 1),  # two lane groups (past 32 lanes), the second partly empty
]
STREAM_GPU_CASES = [
    ((6, 32, 256, AUTO, 0.0), -1),
    ((4, 32, 2048, AUTO, 0.02), -1),
    ((4, 64, 512, AUTO, 0.02), -1),  # v3's lanes and H: two lane groups
]


# The float32 streamed sweeps (stream_f32: the threads' FMAs, W_hh from params), against the fp32
# reference: the same shapes as the streamed ones, and k-groups several quads deep (H = 512, B = 9:
# one lane fragment); on a GPU v5's B and H.
STREAM_F32_CASES = STREAM_CASES + [((3, 9, 512, AUTO, 0.02), 1)]
STREAM_F32_GPU_CASES = STREAM_GPU_CASES


# The k-split backward (CATCHAT_STREAM_KSPLIT, glsl/gru_backward_ksplit.comp; persistent only): one lane
# fragment (8 k-parts) and two (16), a workgroup walking every item and, on a GPU, a few walking several,
# one per item at v5's and v3's widths; with the plain streamed forward before it.
KSPLIT_CASES = [
    ((3, 3, 128, AUTO, 0.0), 1),
    ((3, 20, 256, AUTO, 0.03), 1),
    ((2, 9, 256, AUTO, 0.02), 1),  # one lane fragment, two column groups
]
KSPLIT_GPU_CASES = [
    ((6, 32, 256, AUTO, 0.0), -1),
    ((5, 32, 512, AUTO, 0.02), 3),
    ((4, 32, 2048, AUTO, 0.02), -1),
]


def persistent_counts(dev: Device) -> tuple[int, ...]:
    """Workgroup counts of the persistent parity cases: 1 on any device (a CPU device may run one
    workgroup at a time); on a GPU that reports its SMs also 3 and one per SM."""
    sms = device_sms(dev)
    return (1,) + ((3, sms) if sms >= 3 else ())


def parity_checks(dev: Device) -> list[ParityResult]:
    """Forward and backward sweeps against reference at odd sizes, resets at t=0 and mid-window,
    clamp off and on (hit count exact), per-step and persistent; the GPU dG also reproduce
    reference's dW/db/dx via numpy."""
    out = to_half_checks(dev) if dev.runs_float16 else []
    runs = [(c, 0, "") for c in CASES] + [(c, n, "") for n in persistent_counts(dev) for c in PERSISTENT_CASES]
    if dev.runs_float16:
        runs += [(c, n, "f16w") for c, n in HALF_W_CASES]
    if coopmat_runs(dev) or dev.runs_float16:  # resident tensor-core sweeps, emulated without cooperative matrices
        gpu = coopmat_runs(dev)
        runs += [(c, n and device_sms(dev), "coop") for c, n in COOP_CASES + (COOP_GPU_CASES if gpu else [])]
        # the register-resident float32 forward from float16 splits, the backward on the FMAs
        runs += [(c, n and device_sms(dev), "rsplit32") for c, n in RSPLIT_CASES + (RSPLIT_GPU_CASES if gpu else [])]
    if dev.runs_float16:  # -1: one workgroup per SM; stream16: with float16 saves (the program's at fp16)
        stream = STREAM_CASES + (STREAM_GPU_CASES if coopmat_runs(dev) else [])
        runs += [(c, device_sms(dev) if n < 0 else n, v) for c, n in stream for v in ("stream", "stream16")]
        # stream16f: the forward's W_hh in fragment order (FragOrder), at a lane group's worth and past it
        runs += [(c, device_sms(dev) if n < 0 else n, "stream16f") for c, n in stream[2:]]
    stream32 = STREAM_F32_CASES + (STREAM_F32_GPU_CASES if dev.info.type != "CPU" else [])
    runs += [(c, device_sms(dev) if n < 0 else n, "stream32") for c, n in stream32]
    if dev.runs_float16:
        ksplit = KSPLIT_CASES + (KSPLIT_GPU_CASES if coopmat_runs(dev) else [])
        runs += [(c, device_sms(dev) if n < 0 else n, v) for c, n in ksplit for v in ("ksplit", "ksplit16")]
    # the float32 k-split (ksplit32) against the fp32 reference: the same shapes, on any device (no tensor
    # cores needed), v5's width on a GPU
    ksplit32 = KSPLIT_CASES + (KSPLIT_GPU_CASES if dev.info.type != "CPU" else [])
    runs += [(c, device_sms(dev) if n < 0 else n, "ksplit32") for c, n in ksplit32]
    if dev.runs_float16:  # the float32 forward from float16 splits (split32), the float32 streamed backward after it
        split = STREAM_CASES + (STREAM_GPU_CASES if coopmat_runs(dev) else [])
        runs += [(c, device_sms(dev) if n < 0 else n, "split32") for c, n in split]
    for i, ((T, B, H, tiles, clamp), n_wg, variant) in enumerate(runs):
        case = make_case(T, B, H)
        in_save = i % 3 != 2  # every third case writes dGh to a buffer of its own (as the tuner does)
        streamed = variant in ("stream", "stream16", "stream16f", "ksplit", "ksplit16")
        coop, half_saves = variant == "coop" or streamed, variant in ("stream16", "stream16f", "ksplit16")
        with env_override(KSPLIT_ENV, "1" if variant.startswith("ksplit") else "0"):
            got = run_gru_gpu(dev, case, clamp, tiles, persistent=(n_wg, n_wg), dgh_in_save=in_save,
                              w_half=variant == "f16w" or streamed, coop=coop,
                              stream_f32=variant in ("stream32", "ksplit32"), save_half=half_saves,
                              split=variant == "split32", w_frag=variant == "stream16f",
                              resident_split=variant == "rsplit32")
        if variant == "f16w":
            case = half_weights(case)
        forced = ((got["hprev"], got["dgh"]) + ((got["save"],) if half_saves else ())) if coop \
            else (got["hprev"], got["dgh"]) if variant in ("split32", "rsplit32") else None
        exp, cache = expected_gru(case, clamp, recurrent="fp16" if coop else "fp32", forced=forced,
                                  saves="fp16" if half_saves else "fp32")
        shape = f"T={T} B={B} H={H} tiles={'auto' if tiles == AUTO else tiles} clamp={clamp}" \
            + (f" persistent={n_wg}" if n_wg else "") + ("" if in_save or half_saves else " dGh apart")
        fwd, bwd = (f"gru_forward_{variant}", f"gru_backward_{variant}") if variant else ("gru_forward", "gru_backward")
        # the split's own tolerance where tensor cores truncate its sums; emulated fragments sum to nearest
        split_tol = (SPLIT_ATOL, SPLIT_RTOL) if variant in ("split32", "rsplit32") and coopmat_runs(dev) else None
        for k in ("o", "hprev", "save", "hT"):
            # float16 saves: the twin's gates, a float32 ulp from the GPU's, may round to the next half
            tol = (SAVE16_ATOL, SAVE16_RTOL) if half_saves and k == "save" else split_tol or (FWD_ATOL, FWD_RTOL)
            out.append(compare(f"{fwd}.{k}", shape, got[k], exp[k], *tol))
        for k in ("dgi", "dgh", "dh0"):
            out.append(compare(f"{bwd}.{k}", shape, got[k], exp[k], *(split_tol or (BWD_ATOL, BWD_RTOL))))
        out.append(compare(f"{bwd}.clamp_hits", shape, [got["hits"]], [exp["hits"]], 0.0, 0.0))
        if variant in ("split32", "rsplit32"):  # the float32 forward would pass the rest
            out.append(compare(f"{fwd}.ran_split", shape, [got["ran_split"]], [True], 0.0, 0.0))
        if variant.startswith("ksplit"):  # the plain split where the k-split could not run would pass the rest
            out.append(compare(f"{bwd}.ran_ksplit", shape, [got["tiles"][1].ksplit], [True], 0.0, 0.0))
        if n_wg:
            out.append(compare("gru_sweep.barrier_timeouts", shape, [got["sync_timeouts"]], [0], 0.0, 0.0))
        # the weight gradients the post-sweep GEMMs will form from these dG, against reference's own
        r = ref.gru_layer_backward(case["do"], None, cache, clamp or None)
        g = ref.gru_weight_grads(got["dgi"], got["dgh"], case["x"], got["hprev"], case["p"]["weight_ih"])
        atol, rtol = split_tol or (BWD_ATOL, BWD_RTOL)
        for name, a, e in zip(("dx", "dw_ih", "dw_hh", "db_ih", "db_hh"), g, r[:1] + r[2:6]):
            out.append(compare(f"{bwd}.{name}", shape, a, e, 4 * atol * np.sqrt(T * B), rtol))  # sums over T*B rows
        if got["db"] is not None:  # the streamed sweeps' own bias sums (BIAS_SUMS)
            for name, a, e in zip(("db_ih", "db_hh"), got["db"], r[4:6]):
                out.append(compare(f"{bwd}.{name} (sweep sums)", shape, a, e, 4 * atol * np.sqrt(T * B), rtol))
    return out


# ToHalf (glsl/to_half.comp): W_hh's float16 copy for the streamed sweeps, which is the split forward's hi,
# and its lo (LO: on NVIDIA 580.159 a lo from float(float16_t(x)) came out 0, the round trip folded). (n,
# block columns, x offset, y offset) at odd sizes and offsets; on a GPU a whole v5 W_hh [3H, H].
TO_HALF_CASES = [(1003, 0, 5, 3), (48 * 32, 32, 7, 16), (16 * 48 * 3, 48, 0, 1)]
TO_HALF_GPU_CASES = [(3 * 2048 * 2048, 2048, 0, 0)]
# hi + lo / 2^11 against x: 22 bits (hi's 11, lo's 11), and below float16's normal range lo's subnormal
# floor, 2^-25 / 2^11
SPLIT_COPY_ATOL, SPLIT_COPY_RTOL = 2.0**-36, 2.0**-21


def to_half_checks(dev: Device) -> list[ParityResult]:
    """ToHalf against numpy: float16(x) bitwise (to nearest even, subnormals kept) and, with it as hi, the
    split's lo to float32's precision as hi + lo / SPLIT_SCALE; in rows and in 16 x 16 blocks, at
    offsets, x from 2^-30 to 2^4."""
    out = []
    cases = TO_HALF_CASES + (TO_HALF_GPU_CASES if dev.info.type != "CPU" else [])
    for n, cols, x_off, y_off in cases:
        rng = np.random.default_rng(n + cols)
        x = (rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-30, 4, n))).astype(np.float32)
        tx = dev.tensor(np.concatenate([np.zeros(x_off, np.float32), x]))
        ty = dev.tensor(np.zeros((y_off + n + 1) // 2, np.uint32), np.uint32)
        hi, lo = (to_half_run(dev, tx, ty, n, x_off, y_off, cols, lo) for lo in (False, True))
        shape = f"n={n}" + (f" blocks of {cols} columns" if cols else "") + f" offsets {x_off},{y_off}"
        wrong = np.count_nonzero(hi.view(np.uint16) != x.astype(np.float16).view(np.uint16))
        out.append(compare("to_half.whole (halves not bitwise)", shape, [wrong], [0], 0.0, 0.0))
        back = hi.astype(np.float64) + lo.astype(np.float64) / SPLIT_SCALE
        out.append(compare("to_half.lo (hi + lo / 2^11)", shape, back, x, SPLIT_COPY_ATOL, SPLIT_COPY_RTOL))
    return out


def to_half_run(dev: Device, tx, ty, n: int, x_off: int, y_off: int, cols: int, lo: bool) -> np.ndarray:
    """ToHalf (lo: its LO) from tx into ty, read back as n row-major halves."""
    k = ToHalf(dev, tx, ty, n, x_off=x_off, y_off=y_off, block_cols=cols, lo=lo)
    (w,) = run_ops(dev, [tx, ty], k.ops(), [ty])
    halves = unpack_half(w, 2 * w.size)[y_off:][:n]
    return unblock(halves, cols) if cols else halves


def unblock(halves: np.ndarray, cols: int) -> np.ndarray:
    """block_halves' inverse: the row-major matrix of `cols` columns from its 16 x 16 blocks."""
    return halves.reshape(-1, cols // 16, 16, 16).transpose(0, 2, 1, 3).reshape(-1)
