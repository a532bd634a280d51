"""The streamed tensor-core sweeps (glsl/gru_*_stream.comp, catchat/vk/kernels/gru/stream.py) in a
program and in its plan, and the register-resident ones (gru_*_resident.comp's COOP) in a program. Their
sweep-level parity is in test_gru.py's test_parity (variants "stream", "coop"); here lavapipe runs them
with emulated fragments, so the program is forced onto them."""

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout
from catchat.parity import model as model_parity
from catchat.vk.kernels import gru, run_ops, unpack_half
from catchat.vk.kernels.gru import plan as gru_plan  # where program_products asks
from catchat.vk.program import Program, plan

from support import streamed_like_the_twin


@pytest.mark.parametrize("frag", ["0", "1"])
def test_program_trains_on_streamed_sweeps(dev, streamed, monkeypatch, frag):
    """A whole fp16 training step on the streamed sweeps against the fp16 twin (loss, logits, every
    gradient, the step) at the model parity's fp16 tolerances, on its first case's window (T=7, B=3)
    at the smallest H the streamed sweeps take; and W_hh's float16 copy follows the parameters
    through the step. frag: the forward's own copy in fragment order beside it (CATCHAT_FRAG_W), which
    follows them too (emulated fragments: each 16 x 16 block transposed, the forward's operand row-major)."""
    monkeypatch.setenv("CATCHAT_FRAG_W", frag)
    label, base, T, B, hp = model_parity.MODEL_CASES[0]
    spec = replace(base, hidden=16)
    hp = replace(hp, loss_scale=model_parity.FP16_SCALE)
    results = model_parity.model_parity(dev, spec, T, B, hp, label=f"{label}, streamed", precision="fp16")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)

    layout = ParamLayout(spec)
    flat, tokens, targets, resets, _ = model_parity.model_inputs(spec, T, B)
    before = dev.allocated_bytes
    prog = Program(dev, layout, T, B, precision="fp16")
    assert prog.fwd.gru[0].stream and prog.bwd.layers[1].gru.stream and prog.fwd.w16 is not None
    assert all(g.w_frag == (frag == "1") for g in prog.fwd.gru)
    assert dev.allocated_bytes - before == Program.planned_bytes(layout, T, B, True, dev, "fp16")
    prog.set_params(flat)
    prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    prog.set_carry(None)
    assert not prog.train_step([(tokens, targets, resets)], hp, global_step=0).skipped
    (params,) = prog.read("params")
    (w16,) = run_ops(dev, [], [], [prog.fwd.w16])
    halves = unpack_half(w16, 2 * w16.size)
    for l in range(spec.layers):
        w = layout.view(params, f"layers.{l}.gru.weight_hh").ravel()
        n = w.size
        assert not np.array_equal(w, layout.view(flat, f"layers.{l}.gru.weight_hh").ravel())  # the step moved it
        np.testing.assert_array_equal(halves[l * n:(l + 1) * n], w.astype(np.float16))
        if frag == "1":  # H = 16: W_hh's 3 blocks are its rows of 16 in order, each transposed here
            at = (spec.layers + l) * n
            blocks = w.astype(np.float16).reshape(3, 16, 16).transpose(0, 2, 1).ravel()
            np.testing.assert_array_equal(halves[at:at + n], blocks)


def test_streamed_program_keeps_float16_saves(dev, streamed):
    """At fp16 on the streamed sweeps the saves are float16 (half the bytes of a save row) and dGh's n
    third goes to one [T,B,H] buffer, its r and z thirds read from dGi: W_hh's weight and bias
    gradients in two parts each; at fp32 the saves stay float32 with dGh over them."""
    spec, T, B = ModelSpec(vocab_size=101, hidden=16, layers=2), 5, 3
    layout = ParamLayout(spec)
    half = Program(dev, layout, T, B, precision="fp16")
    full = Program(dev, layout, T, B)
    assert half.geometry.save16 and not full.geometry.save16
    assert half.buffers.save[0].size() * 2 == full.buffers.save[0].size() == T * B * 4 * spec.hidden
    assert half.buffers.dgh_n.size() == T * B * spec.hidden and full.buffers.dgh_n is None
    for lay in half.bwd.layers:
        assert lay.gru.save_half and lay.gru.dgh_ld == spec.hidden
        assert (lay.dw_hh.M, lay.dw_hh_n.M) == (32, 16)
    assert all(lay.dw_hh_n is None and lay.dw_hh.M == 48 for lay in full.bwd.layers)


@pytest.mark.parametrize("T, B, split_w, split_wn, in_x", [(7, 3, 2, 3, False), (12, 3, 1, 2, True)])
def test_streamed_program_splits_dw_hh_n_on_its_own(dev, streamed, monkeypatch, T, B, split_w, split_wn, in_x):
    """dW_hh's n third ([H, H] from dgh_n: a third of the [3H, H] output tiles) takes its own split-K
    count (`Geometry.split_wn`; v5 at fp16 on a GPU: 2, where the [3H, H] gradients take 1 and it fell
    to the small tile unsplit). Forced to 3 beside the others' 2, or to 2 beside 1: each GEMM gets its
    own, the larger partials decide whether they fit x[L] (T*B = 36 rows: [2, H, H] do) or go to `ws`
    (21 rows: [2, 3H, H] do not), and a training step matches the fp16 twin."""
    monkeypatch.setattr(plan, "gemm_split_k", lambda dev, M, N, K: split_wn if M == N else split_w if M == 3 * N else 1)
    spec, H = ModelSpec(vocab_size=101, hidden=16, layers=2), 16
    prog = Program(dev, ParamLayout(spec), T, B, precision="fp16")
    g, b = prog.geometry, prog.buffers
    assert (g.split_w, g.split_wn, g.split_head) == (split_w, split_wn, 1) and g.split_in_x == in_x
    assert b.ws.size() == (1 if in_x else 2 * 3 * H * H)  # there: the [2, 3H, H] partials, the larger
    for lay in prog.bwd.layers:
        assert (lay.dw_hh.split_k, lay.dw_hh_n.split_k) == (split_w, split_wn)
        assert lay.dw_hh_n.work is (b.x[-1] if in_x else b.ws)
    assert prog.bwd.layers[1].dw_ih.split_k == split_w
    label, _, _, _, hp = model_parity.MODEL_CASES[0]
    hp = replace(hp, loss_scale=model_parity.FP16_SCALE)
    results = model_parity.model_parity(dev, spec, T, B, hp, label=f"{label}, dW_hh's n third split",
                                        precision="fp16")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


@pytest.mark.parametrize("summed", [True, False])
def test_streamed_backward_sums_the_biases(dev, streamed, monkeypatch, summed):
    """The streamed backward sweeps sum the bias gradients over the window themselves (BIAS_SUMS): each
    layer's db_ih and db_hh are then column sums over the sweep's [B, 6H] (B rows, not T*B), and nothing
    sums dGh's n third apart; CATCHAT_SWEEP_BIAS=0 keeps the column sums over the rows. Either way the
    program allocates what its plan says, and the step's gradients match the twin's (the model parity,
    on the first case's window at H = 16)."""
    monkeypatch.setenv(gru.BIAS_ENV, "1" if summed else "0")
    spec, T, B = ModelSpec(vocab_size=101, hidden=16, layers=2), 5, 3
    layout, H = ParamLayout(spec), spec.hidden
    before = dev.allocated_bytes
    prog = Program(dev, layout, T, B, precision="fp16")
    assert dev.allocated_bytes - before == Program.planned_bytes(layout, T, B, True, dev, "fp16")
    for lay in prog.bwd.layers:
        if summed:
            assert lay.gru.bias_sums.size() == 6 * B * H and lay.db_hh_n is None
            assert [(k.M, k.N) for k in (lay.db_ih, lay.db_hh)] == [(B, 3 * H)] * 2
        else:
            assert lay.gru.bias_sums is None
            assert [(k.M, k.N) for k in (lay.db_ih, lay.db_hh, lay.db_hh_n)] == [(T * B, 3 * H), (T * B, 2 * H),
                                                                                  (T * B, H)]
    label, base, T0, B0, hp = model_parity.MODEL_CASES[0]
    hp = replace(hp, loss_scale=model_parity.FP16_SCALE)
    results = model_parity.model_parity(dev, replace(base, hidden=16), T0, B0, hp, label=label, precision="fp16")
    bias = [r for r in results if "bias" in r.kernel or "bias" in r.shape]
    assert bias and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


@pytest.mark.parametrize("products", ["resident", "mixed"])
def test_program_trains_on_resident_tensor_core_sweeps(dev, monkeypatch, products):
    """A whole fp16 training step on the register-resident tensor-core sweeps ("resident": both directions;
    "mixed": the resident forward, the streamed backward, v3's eval and its plan on an H200) against the
    fp16 twin at the model parity's fp16 tolerances, on emulated fragments. One workgroup a sweep
    (CATCHAT_PERSISTENT=1: lavapipe runs one at a time) at 16 lanes and 16 units, so the resident sweeps
    plan their 16 x 16 tiles, as v3's do on a GPU."""
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    monkeypatch.setattr(gru_plan, "sweep_products", lambda dev, B, H, precision: products if precision == "fp16"
                        else None)
    label, base, T, _, hp = model_parity.MODEL_CASES[0]
    spec, B = replace(base, hidden=16), 16
    hp = replace(hp, loss_scale=model_parity.FP16_SCALE)
    results = model_parity.model_parity(dev, spec, T, B, hp, label=f"{label}, {products}", precision="fp16")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    prog = Program(dev, ParamLayout(spec), T, B, precision="fp16")
    assert all(k.coop and not k.stream and k.defines.get("EMU") and gru.coop_tiles_ok(k.tiles) for k in prog.fwd.gru)
    backward = [layer.gru for layer in prog.bwd.layers]
    assert all(k.coop and (k.stream if products == "mixed" else gru.coop_tiles_ok(k.tiles)) for k in backward)


def test_mixed_sweeps_plan(dev, monkeypatch):
    """"mixed" (the resident forward, the streamed backward: v3 on an H200) keeps float32 saves with dGh
    over them, plans W_hh's float16 copy and the backward's dGh shadow but no h_prev shadow, and no
    resident partial products; a forward-only program runs the resident forward alone (a program on them:
    the test above, and catchat parity's "v3 mixed" rows on a GPU)."""
    monkeypatch.setattr(gru_plan, "sweep_products", lambda dev, B, H, precision: "mixed" if precision == "fp16"
                        else None)
    layout, T, B, H = ParamLayout(ModelSpec(vocab_size=101, hidden=16, layers=2)), 5, 3, 16
    train = plan.Geometry.of(layout, T, B, dev, True, "fp16")
    eval_only = plan.Geometry.of(layout, T, B, dev, False, "fp16")
    assert train.products == "mixed" and not train.save16 and eval_only.products == "resident"
    scratch = dict(plan.kernel_scratch(train, True, dev, "fp16"))
    assert scratch["streamed sweeps' float16 W_hh"] == 2 * 3 * H * H // 2
    assert "backward sweeps' float16 dGh" in scratch and "forward sweeps' float16 h_prev" not in scratch
    # dhz, the barrier's words and the bias sums [B, 6H] (the streamed backward's BIAS_SUMS)
    assert scratch["GRU backward sweep scratch"] == 2 * (B * H + gru.sync_words(B) + 6 * B * H)
    assert not [w for w in plan.kernel_scratch(eval_only, False, dev, "fp16") if "streamed" in w[0]]


@pytest.mark.parametrize("products", ["stream", "stream32"])
def test_stepwise_path_on_streamed_sweeps(dev, monkeypatch, products):
    """The per-timestep path (scheduled sampling) runs a streamed sweep's prologue before step 0:
    at tf = 1 it equals the batched path at fp16 (float16 saves, or float32 ones with both wavefronts:
    "stream32", what two layers or more plan on a GPU where each sweep fits half of it)."""
    monkeypatch.setattr(gru_plan, "sweep_products", lambda dev, B, H, precision: products if precision == "fp16"
                        else None)
    if products == "stream32":
        monkeypatch.setenv("CATCHAT_WAVEFRONT", "2")
    spec = ModelSpec(vocab_size=101, hidden=16, layers=2)
    layout = ParamLayout(spec)
    flat, tokens, targets, resets, _ = model_parity.model_inputs(spec, 5, 3, seed=4)
    prog = Program(dev, layout, 5, 3, precision="fp16")
    hp = replace(model_parity.MODEL_CASES[0][4], lr=0.0, weight_decay=0.0, loss_scale=model_parity.FP16_SCALE)

    def run(stepwise):
        prog.set_params(flat)
        prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
        prog.set_carry(None)
        st = prog.train_step([(tokens, targets, resets)], hp, global_step=0, stepwise=stepwise)
        return st.loss, prog.read("grads")[0]

    (loss_s, grads_s), (loss_b, grads_b) = run(True), run(False)
    assert prog.fwd.gru[0].stream
    assert loss_s == pytest.approx(loss_b, rel=1e-6)
    np.testing.assert_allclose(grads_s, grads_b, rtol=1e-5, atol=1e-7)


def test_stream_planning(dev, monkeypatch):
    """Where a program streams W_hh: fp16 on a device with cooperative matrices and persistent sweeps
    shown co-resident, H a multiple of 16, B <= 32, the resident 16 x 16 tiles not planned; never on a
    device without them (lavapipe), at fp32, or with CATCHAT_SWEEP_COOP=0."""
    from catchat.vk.kernels.gemm import COOP_SHAPE
    from catchat.vk.kernels.gru import plan as gru_plan

    monkeypatch.delenv(gru.COOP_ENV, raising=False)
    assert not gru.stream_sweeps(dev, 32, 2048, "fp16") or dev.info.type != "CPU"
    info = dataclasses.replace(dev.info, subgroup_size=32, type="DiscreteGpu", compute_units=132,
                               max_shared_memory_bytes=48 * 1024, max_workgroup_invocations=1024)
    tc = dataclasses.replace(dev, info=info, coop_shapes=(COOP_SHAPE,), features=dev.features | {"cooperativeMatrixNV"})
    tiled = gru.SweepPlan((8, 8, 4, 1, 1, 64), 0, None)  # no resident 16 x 16 tiles planned
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda *a, **k: tiled)
    assert gru.stream_sweeps(tc, 32, 2048, "fp16") and gru.coop_sweeps(tc, 32, 2048, "fp16")
    assert gru.sweep_products(tc, 32, 2048, "fp16") == "stream"
    for choice in ("1", "resident", "stream"):  # where the resident tiles do not fit, any coop choice streams
        monkeypatch.setenv(gru.COOP_ENV, choice)
        assert gru.sweep_products(tc, 32, 2048, "fp16") == "stream", choice
    monkeypatch.setenv(gru.COOP_ENV, "stream32")  # streamed with float32 saves, to measure
    assert gru.sweep_products(tc, 32, 2048, "fp16") == "stream32" and gru.streams_forward("stream32")
    monkeypatch.delenv(gru.COOP_ENV)
    assert gru.stream_sweeps(tc, 5, 48, "fp16")
    assert gru.stream_sweeps(tc, 33, 2048, "fp16")  # two lane groups: 132 workgroups walk 256 items
    assert not gru.stream_sweeps(tc, 65, 2048, "fp16")  # three lane groups: not a split it has
    assert not gru.stream_sweeps(tc, 32, 2040, "fp16")  # H not a multiple of 16
    assert not gru.stream_sweeps(tc, 32, 2048, "fp32")
    monkeypatch.setenv(gru.COOP_ENV, "0")
    assert not gru.stream_sweeps(tc, 32, 2048, "fp16")
    monkeypatch.delenv(gru.COOP_ENV)
    coop_tiles = gru.SweepPlan(gru.ResidentTiles(16, 16, 2, 2, 4), 132, None)  # W_hh on chip
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda *a, **k: coop_tiles)
    # the forward on the resident tiles, the backward streamed (faster on the H200 at v3)
    assert not gru.stream_sweeps(tc, 64, 512, "fp16") and gru.coop_sweeps(tc, 64, 512, "fp16")
    assert gru.sweep_products(tc, 64, 512, "fp16") == "mixed" and gru.streams_backward("mixed")
    assert gru.sweep_products(tc, 65, 512, "fp16") == "resident"  # past the streamed sweeps' lanes
    assert gru.sweep_products(tc, 64, 520, "fp16") == "resident"  # H not a multiple of 16
    monkeypatch.setenv(gru.COOP_ENV, "resident")  # to compare: the resident tiles both ways
    assert gru.sweep_products(tc, 64, 512, "fp16") == "resident" and not gru.streams_backward("resident")
    monkeypatch.setenv(gru.COOP_ENV, "stream")  # to compare: streamed both ways where the resident tiles fit
    assert gru.sweep_products(tc, 64, 512, "fp16") == "stream"
    monkeypatch.setenv(gru.COOP_ENV, "stream32")
    assert gru.sweep_products(tc, 64, 512, "fp16") == "stream32" and gru.streams_backward("stream32")
    monkeypatch.delenv(gru.COOP_ENV)
    # a program of two layers or more streams both ways with float32 saves where "mixed" would run and each
    # direction's streamed sweep takes at most half the SMs (v3 at 64 lanes: 64 workgroups of 132)
    assert gru.streams_in_halves(tc, 64, 512) and not gru.streams_in_halves(tc, 64, 2048)  # 256 slices
    for training in (True, False):
        assert gru.program_products(tc, 64, 512, 3, "fp16", training) == "stream32"
        assert gru.program_products(tc, 64, 512, 2, "fp16", training) == "stream32"
    assert gru.program_products(tc, 64, 512, 1, "fp16", True) == "mixed"  # no second layer to overlap
    assert gru.program_products(tc, 64, 512, 1, "fp16", False) == "resident"  # an eval program: the forward alone
    for choice, training, want in (("1", True, "stream32"), ("mixed", True, "mixed"), ("mixed", False, "resident"),
                                   ("resident", True, "resident"), ("stream", True, "stream")):
        monkeypatch.setenv(gru.COOP_ENV, choice)  # asked for: as asked
        assert gru.program_products(tc, 64, 512, 3, "fp16", training) == want, choice
    monkeypatch.delenv(gru.COOP_ENV)
    half = dataclasses.replace(tc, info=dataclasses.replace(info, compute_units=120))  # 64 > 120 // 2
    assert not gru.streams_in_halves(half, 64, 512) and gru.program_products(half, 64, 512, 3, "fp16", True) == "mixed"
    monkeypatch.setenv("CATCHAT_PERSISTENT", "0")  # a dispatch per step: nothing runs side by side
    assert not gru.streams_in_halves(tc, 64, 512)
    monkeypatch.delenv("CATCHAT_PERSISTENT")
    monkeypatch.setenv(gru.COOP_ENV, "yes")
    with pytest.raises(UsageError, match="CATCHAT_SWEEP_COOP"):
        gru.sweep_products(tc, 32, 2048, "fp16")
    monkeypatch.delenv(gru.COOP_ENV)
    # the split and resources at v5
    fwd, bwd = gru.stream_tiles(32, 2048, False), gru.stream_tiles(32, 2048, True)
    assert (fwd, bwd) == (gru.StreamTiles(2, 8, 2, 2, flags=True),
                          gru.StreamTiles(2, 24, 4, 20, flags=True, ksplit=gru.stream.KSPLIT_DEFAULT))
    assert gru.stream_tiles(16, 2048, False) == gru.StreamTiles(1, 16, 2, 2, flags=True)  # one lane fragment
    assert gru.stream_tiles(3, 48, True).resident == 2  # no more than a k-group's fragments
    assert gru.stream_tiles(3, 32, True).depth == 1  # no deeper than a k-group's fragments
    monkeypatch.setenv(gru.DEPTH_ENV, "2,16")
    assert gru.stream_tiles(32, 2048, False).depth == 2 and gru.stream_tiles(32, 2048, True).depth == 16
    monkeypatch.setenv(gru.DEPTH_ENV, "two")
    with pytest.raises(UsageError, match="CATCHAT_STREAM_DEPTH"):
        gru.stream_tiles(32, 2048, False)
    with pytest.raises(ValueError, match="multiple of 16"):
        gru.stream_tiles(3, 40, False)


def test_streamed_sweep_refuses_misaligned_w16(dev):
    """The float16 W_hh copy must start on a 16-byte boundary (fragment rows)."""
    from catchat.parity import gru as gru_parity
    from catchat.vk.kernels import half_tensor

    case = gru_parity.make_case(2, 3, 16)
    t = dev.tensor
    w16 = half_tensor(dev, np.zeros(3 * 16 * 16 + 8))
    with pytest.raises(ValueError, match="multiple of 8 halves"):
        gru.GruForward(dev, t(2 * 3 * 48), t(case["flat"]), t(2 * 3 * 16), t(np.zeros(6), np.uint32), t(3 * 3 * 16),
                       t(3 * 3 * 16), t(2 * 3 * 64), t(2 * 3 * 16), T=2, B=3, H=16, w_off=4, b_off=0, coop=True,
                       w_half=w16, hprev_off=0, o_off=3 * 16)


def test_streamed_forward_reads_h_prev_in_the_order_its_gates_wrote(dev, monkeypatch):
    """FRAG_H: the gates write each element of h_prev's shadow where an A fragment's order puts it and the
    product reads the blocks in that order. Emulated with EMU_A_PERM, the order is a real permutation
    (PTX's mma layout), so a writer and a reader that disagreed would multiply another h_prev."""
    from catchat.parity import gru as gru_parity
    from catchat.vk.kernels.gru import stream, sweeps

    monkeypatch.setenv(stream.FRAG_H_ENV, "1")
    plain = stream.stream_defines
    defines = []

    def perm(tiles, H, backward, emulate, subgroup=0):
        d = plain(tiles, H, backward, emulate, subgroup)
        d = {**d, "EMU_A_PERM": 1} if "FRAG_H" in d and emulate else d
        defines.append(d)
        return d

    monkeypatch.setattr(sweeps, "stream_defines", perm)
    case = gru_parity.make_case(3, 20, 32)  # two lane fragments, two k-groups
    got = gru_parity.run_gru_gpu(dev, case, 0.0, persistent=(1, 1), w_half=True, coop=True, save_half=True)
    exp, _ = gru_parity.expected_gru(case, 0.0, recurrent="fp16", forced=(got["hprev"], got["dgh"], got["save"]),
                                     saves="fp16")
    for k in ("o", "hprev", "hT", "dgi", "dh0"):
        np.testing.assert_allclose(got[k], exp[k], atol=gru_parity.FWD_ATOL, rtol=gru_parity.FWD_RTOL, err_msg=k)
    assert any("EMU_A_PERM" in d for d in defines) == (not gru_parity.coopmat_runs(dev))


@pytest.mark.parametrize("depth", ["1,1", "3,3"])
def test_streamed_sweeps_refill_their_ring(dev, monkeypatch, depth):
    """Rings shallower than a k-group (fragments loaded mid-loop into a slot just multiplied, a
    partial last round at depth 3): the same results as the twin."""
    from catchat.parity import gru as gru_parity

    monkeypatch.setenv(gru.DEPTH_ENV, depth)
    monkeypatch.setenv(gru.RESIDENT_ENV, "0,0")
    case = gru_parity.make_case(2, 3, 160)  # 10 and 30 fragments deep: 2 and 4 per k-group
    got = gru_parity.run_gru_gpu(dev, case, 0.02, w_half=True, coop=True)
    exp, _ = gru_parity.expected_gru(case, 0.02, recurrent="fp16", forced=(got["hprev"], got["dgh"]))
    for k in ("o", "hprev", "save", "hT", "dgi", "dgh", "dh0"):
        np.testing.assert_allclose(got[k], exp[k], atol=gru_parity.FWD_ATOL, rtol=gru_parity.FWD_RTOL, err_msg=k)
    assert got["hits"] == exp["hits"]



@pytest.mark.parametrize("T,B,H,n_wg,resident,depth,kept", [
    (3, 17, 48, 0, "1,1", "4,8", (1, 1)),  # a dispatch per step; k-groups left empty, short ones
    (2, 20, 256, 0, "1,2", "1,1", (1, 2)),  # the ring refilled past the resident fragments
    (3, 20, 16, 1, "1,1", "4,8", (1, 1)),  # persistent, one slice per workgroup: every fragment resident
    (2, 5, 64, 1, "1,1", "4,8", (0, 0)),  # persistent, 4 slices on one workgroup: no resident W_hh
])
def test_streamed_sweeps_keep_w_hh_resident(dev, monkeypatch, T, B, H, n_wg, resident, depth, kept):
    """CATCHAT_STREAM_RESIDENT (RES): a k-group's first W_hh fragments loaded once per dispatch and
    kept in registers, where every workgroup has one slice (else dropped); two lane fragments per
    subgroup (B > 16) and one: the same results as the twin."""
    monkeypatch.setenv(gru.RESIDENT_ENV, resident)
    monkeypatch.setenv(gru.DEPTH_ENV, depth)
    got = streamed_like_the_twin(dev, T, B, H, n_wg)
    assert tuple(t.resident for t in got["tiles"]) == kept
    monkeypatch.setenv(gru.RESIDENT_ENV, "1")
    with pytest.raises(UsageError, match="CATCHAT_STREAM_RESIDENT"):
        gru.stream_tiles(B, H, False)


@pytest.mark.parametrize("T,B,H,n_wg,resident,shared,kept", [
    (4, 3, 256, 0, "0,1", "1,9", (1, 5)),  # forward: shared, ring; backward: registers, shared (cut), ring
    (3, 20, 16, 1, "0,0", "1,1", (0, 1)),  # persistent, one slice per workgroup (the forward: no room)
    (2, 5, 64, 1, "0,0", "1,2", (0, 0)),  # persistent, 4 slices on one workgroup: none kept
])
def test_streamed_sweeps_keep_w_hh_in_shared_memory(dev, monkeypatch, T, B, H, n_wg, resident, shared, kept):
    """CATCHAT_STREAM_SHARED (SRES): the W_hh fragments of a k-group's next k-fragments after the
    resident ones copied into shared memory once per dispatch, cut to what fits beside `red` (lavapipe:
    32 KB) and to a k-group's fragments, dropped where a workgroup walks several slices: the same
    results as the twin."""
    monkeypatch.setenv(gru.RESIDENT_ENV, resident)
    monkeypatch.setenv(gru.SHARED_ENV, shared)
    monkeypatch.setenv(gru.DEPTH_ENV, "4,8")  # as the resident test's (shared shader variants where none is kept)
    got = streamed_like_the_twin(dev, T, B, H, n_wg)
    assert tuple(t.shared for t in got["tiles"]) == kept


@pytest.mark.parametrize("T,B,H,n_wg,f32,shared", [
    (3, 20, 16, 1, False, "0,1"),  # one slice per workgroup, two lane fragments: k-groups 1..15 have no
    # blocks; the backward's W_hh in shared memory
    (3, 3, 16, 1, False, "1,1"),  # one lane fragment, both directions' W_hh in shared memory
    (4, 5, 64, 1, False, "0,0"),  # 4 slices on one workgroup: each arrives for its own k-group in turn
    (4, 17, 48, 1, True, "0,0"),  # float32 FMAs, short k-groups
    (3, 9, 512, 1, True, "0,0"),  # k-groups several blocks deep (forward 2, backward 6)
    (3, 3, 48, 0, False, "1,1"),  # a dispatch per step: the flags are ignored
])
def test_streamed_sweeps_wait_on_block_flags(dev, monkeypatch, T, B, H, n_wg, f32, shared):
    """CATCHAT_STREAM_FLAGS=1 (KFLAGS): each subgroup waits for the blocks of the shadow its k-group
    reads instead of meeting every workgroup at the grid barrier; the same results as the twin, no
    wait given up (lavapipe runs one workgroup: a wrong block count there is a wait that never ends)."""
    monkeypatch.setenv(gru.FLAGS_ENV, "1")
    monkeypatch.setenv(gru.SHARED_ENV, shared)
    monkeypatch.setenv(gru.RESIDENT_ENV, "0,0")
    got = streamed_like_the_twin(dev, T, B, H, n_wg, f32, repeat=2 if f32 else 1)
    assert all(t.flags for t in got["tiles"])
    assert tuple(t.shared for t in got["tiles"]) == tuple(int(n) for n in shared.split(","))
    assert not got["sync"].any()  # the last workgroup out zeroed every k-group's word for the next dispatch


@pytest.mark.parametrize("T,B,H,n_wg,f32,flags", [
    (3, 64, 32, 1, False, "0"),  # two full lane groups, one workgroup walking 4 items (grid barrier)
    (3, 50, 16, 1, False, "1"),  # block flags: each lane group's k-groups count apart
    (4, 33, 48, 0, False, "0"),  # a dispatch per step; the second group holds one lane
    (3, 40, 32, 1, True, "1"),  # float32 FMAs with flags
])
def test_streamed_sweeps_take_two_lane_groups(dev, monkeypatch, T, B, H, n_wg, f32, flags):
    """Past 32 lanes the streamed sweeps run lane groups of up to 32 lanes, each its own recurrence
    (its own shadow, its own flags): a work item per (slice, lane group); the same results as the twin."""
    monkeypatch.setenv(gru.FLAGS_ENV, flags)
    got = streamed_like_the_twin(dev, T, B, H, n_wg, f32)
    assert all(t.lane_groups == 2 and t.lane_frags == 2 for t in got["tiles"])
    assert not got["sync"].any()


def test_block_flags_setting(monkeypatch):
    """CATCHAT_STREAM_FLAGS: unset, block flags on tensor cores and the grid barrier for the float32
    sweeps; 0 the barrier and 1 flags for both; anything else is refused with the fix."""
    from catchat.vk.kernels.gru import stream

    def defines(backward: bool) -> dict:
        return stream.stream_defines(gru.stream_tiles(3, 16, backward), 16, backward, True)

    monkeypatch.delenv(gru.FLAGS_ENV, raising=False)
    assert gru.stream_flags() and "KFLAGS" in defines(False) and "KFLAGS" in defines(True)
    assert not gru.stream_flags(f32=True) and not gru.stream_tiles(3, 16, True, f32=True).flags
    monkeypatch.setenv(gru.FLAGS_ENV, "0")
    assert not gru.stream_flags() and "KFLAGS" not in defines(False)
    monkeypatch.setenv(gru.FLAGS_ENV, "1")
    assert gru.stream_flags(f32=True) and gru.stream_tiles(3, 16, True, f32=True).flags
    monkeypatch.setenv(gru.FLAGS_ENV, "yes")
    with pytest.raises(UsageError, match="CATCHAT_STREAM_FLAGS"):
        gru.stream_flags()


def test_shared_w_hh_fits_beside_red():
    """At v5 (B = 32, H = 2048) in an H200's 48 KB: the forward's red (24 KB) leaves room for one
    k-fragment's three gate blocks per k-group, the backward's (16 KB) for four blocks."""
    from catchat.vk.kernels.gru import stream

    fwd, bwd = (stream.StreamTiles(2, kpg, 2, res, shared=8) for kpg, res in ((8, 2), (24, 12)))
    assert stream.fit_shared(fwd, False, 48 * 1024).shared == 0  # 24 KB + 4 bytes of flag: 1 block set is 24 KB
    assert stream.fit_shared(fwd, False, 48 * 1024 + 4).shared == 1
    assert stream.fit_shared(bwd, True, 48 * 1024).shared == 3
    assert stream.fit_shared(fwd._replace(flags=True), False, 48 * 1024).shared == 1  # block flags: no shared flag
    assert stream.stream_shared_bytes(stream.fit_shared(bwd, True, 48 * 1024), True) <= 48 * 1024


@pytest.mark.parametrize("frag", ["0", "1"])
def test_planned_bytes_count_the_streamed_sweeps(dev, streamed, monkeypatch, frag):
    """A program on the streamed sweeps allocates what its plan says: the float16 W_hh copy and the
    shadows included (and the forward's copy in fragment order, frag), the saves at half their bytes, dGh's
    n third beside them and the backward's bias sums (the memory check before building it sees them)."""
    monkeypatch.setenv("CATCHAT_FRAG_W", frag)
    T, B, H, L = 5, 3, 32, 2
    layout = ParamLayout(ModelSpec(vocab_size=101, hidden=H, layers=L))
    for training in (True, False):
        before = dev.allocated_bytes
        prog = Program(dev, layout, T, B, training=training, precision="fp16")
        assert prog.fwd.gru[0].stream
        assert dev.allocated_bytes - before == Program.planned_bytes(layout, T, B, training, dev, "fp16")
        stream_words = sum(w for _, w in plan.stream_scratch(prog.geometry, training, dev, "fp16"))
        assert stream_words >= L * 3 * H * H // 2  # W_hh's float16 copy, both layers, and the shadows
        saves_halved, dgh_n = L * T * B * 2 * H, T * B * H if training else 0
        bias_sums = L * 6 * B * H if training else 0  # the streamed backward's [B, 6H] (BIAS_SUMS)
        assert Program.planned_bytes(layout, T, B, training, dev, "fp16") - Program.planned_bytes(
            layout, T, B, training, dev) == 4 * (stream_words - saves_halved + dgh_n + bias_sums)
