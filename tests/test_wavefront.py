"""The batched forward as a wavefront over the layers (CATCHAT_WAVEFRONT, catchat/vk/program/wavefront.py):
the same results as the layer-by-layer pass, for eval and for a training step against the reference, on
the per-step, persistent and streamed sweeps. Lavapipe runs dispatches one at a time, so what it checks
is the schedule's order and row blocks; a GPU runs the stages' dispatches side by side (catchat parity)."""

from dataclasses import replace

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout
from catchat.parity import model as model_parity
from catchat.vk.kernels.gru import plan as gru_plan  # where program_products asks
from catchat.vk.program import Program, plan, sequences, wavefront

SPEC = ModelSpec(vocab_size=101, hidden=12, layers=3)


def test_chunks_of_the_window(monkeypatch):
    monkeypatch.delenv(wavefront.WAVE_ENV, raising=False)
    assert wavefront.wave_chunks(7) == 1
    monkeypatch.setenv(wavefront.WAVE_ENV, "3")
    assert wavefront.wave_chunks(7) == 3 and wavefront.wave_chunks(2) == 2
    assert wavefront.chunk_bounds(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert wavefront.chunk_bounds(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(wavefront.WAVE_ENV, bad)
        with pytest.raises(UsageError, match="CATCHAT_WAVEFRONT"):
            wavefront.wave_chunks(7)


def _logits_and_carry(dev, T: int, B: int) -> tuple:
    layout = ParamLayout(SPEC)
    flat, tokens, _, resets, _ = model_parity.model_inputs(SPEC, T, B, seed=5)
    prog = Program(dev, layout, T, B, training=False)
    prog.set_params(flat)
    prog.set_carry(None)
    logits = prog.forward_logits(tokens, resets)
    return logits, prog.read("h0")[0].copy(), prog


@pytest.mark.parametrize("persistent", ["0", "1"])
def test_wavefront_eval_equals_the_layer_by_layer_pass(dev, monkeypatch, persistent):
    """Three layers over three chunks of 7 steps (the last shorter), a dispatch per step or one
    persistent dispatch per chunk (each continuing from the state the chunk before left): the same
    bits (the chunks' GEMMs sum each output over k in the same order as the window's)."""
    monkeypatch.setenv("CATCHAT_PERSISTENT", persistent)
    monkeypatch.delenv(wavefront.WAVE_ENV, raising=False)
    want, want_h, _ = _logits_and_carry(dev, 7, 3)
    monkeypatch.setenv(wavefront.WAVE_ENV, "3")
    got, got_h, prog = _logits_and_carry(dev, 7, 3)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_h, want_h)
    assert bool(prog.fwd.gru[0].sweep_workgroups) == (persistent == "1")


def test_wavefront_training_step_matches_the_reference(dev, monkeypatch):
    """A whole training step (dropout, label smoothing, the optimizer) with the wavefront forward:
    loss, logits, every gradient and the step against the reference at the model parity's tolerances."""
    monkeypatch.setenv(wavefront.WAVE_ENV, "2")
    _, _, T, B, hp = model_parity.MODEL_CASES[0]
    results = model_parity.model_parity(dev, SPEC, T, B, hp, label="wavefront")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


@pytest.mark.parametrize("products", ["stream", "stream32"])
def test_wavefront_on_the_streamed_sweeps(dev, monkeypatch, products):
    """fp16 on the streamed sweeps (emulated fragments, block flags): each chunk's persistent
    dispatch continues from the float16 shadow the chunk before wrote; a training step against the
    fp16 twin. With float32 saves ("stream32", CATCHAT_SWEEP_COOP=stream32) the backward runs as a
    wavefront too."""
    monkeypatch.setattr(gru_plan, "sweep_products", lambda dev, B, H, precision: products if precision == "fp16"
                        else None)
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    label, _, T, B, hp = model_parity.MODEL_CASES[0]
    chunks = 3 if products == "stream" else 4
    if products == "stream32":  # 8 steps of 4 lanes: the backward's chunks on the norm's 8-row blocks
        T, B = 8, 4
    monkeypatch.setenv(wavefront.WAVE_ENV, str(chunks))
    spec = replace(SPEC, hidden=16)
    results = model_parity.model_parity(dev, spec, T, B, replace(hp, loss_scale=model_parity.FP16_SCALE),
                                        label=f"{label}, streamed wavefront", precision="fp16")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    prog = Program(dev, ParamLayout(spec), T, B, precision="fp16")
    assert prog.geometry.save16 == (products == "stream")
    assert wavefront.recording_info(prog.dev, prog.geometry, prog.fwd, prog.bwd)["wavefront_backward"] == (
        1 if products == "stream" else 4)


@pytest.mark.parametrize("n_wg, kind", [(0, "tiled"), (1, "tiled"), (0, "stream"), (1, "stream"), (1, "stream16"),
                                        (1, "stream32")])
def test_sweeps_in_chunks_give_the_whole_window(dev, n_wg, kind):
    """Each sweep recorded as 3 pieces of a 7-step window (`steps_ops`: the wavefront's chunks; the backward
    from the top chunk down, its running gradient and dGh's shadow carried in memory): the same bits as one
    piece, a dispatch per step or persistent; tiled float32, streamed on (emulated) tensor cores with float32
    and float16 saves, streamed float32."""
    from catchat.parity import gru as gru_parity

    case = gru_parity.make_case(7, 5, 16, seed=4)
    kw = dict(tiled={}, stream=dict(w_half=True, coop=True), stream16=dict(w_half=True, coop=True, save_half=True),
              stream32=dict(stream_f32=True))[kind]
    whole = gru_parity.run_gru_gpu(dev, case, 0.02, persistent=(n_wg, n_wg), **kw)
    chunked = gru_parity.run_gru_gpu(dev, case, 0.02, persistent=(n_wg, n_wg), chunks=3, **kw)
    for k in ("o", "hprev", "save", "hT", "dgi", "dgh", "dh0", "hits", "sync_timeouts"):
        np.testing.assert_array_equal(chunked[k], whole[k], err_msg=k)


def test_backward_chunks_start_on_the_norms_row_blocks():
    assert wavefront.backward_bounds(8, 4, 4, 8) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert wavefront.backward_bounds(8, 3, 4, 8) == [(0, 4), (4, 8)]  # 3 steps rounded up to 2 row blocks
    assert wavefront.backward_bounds(7, 3, 3, 8) == [(0, 7)]  # 8 steps a block boundary: one chunk
    assert wavefront.backward_bounds(1024, 8, 64, 64) == [(t, t + 128) for t in range(0, 1024, 128)]


class _Tag:
    def __init__(self, name: str):
        self.name, self.barrier = name, True


def test_wavefront_backward_schedule(dev, monkeypatch):
    """Three layers over four chunks of an 8-step window, from the top chunk down: wave w runs chunk
    3 - (w - (2 - l)) of layer l, each stage's sweeps side by side, with (CATCHAT_OVERLAP_DW=1) the dW_hh
    of the layer that finished."""
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    monkeypatch.setenv(wavefront.WAVE_ENV, "4")
    monkeypatch.setenv(plan.OVERLAP_ENV, "1")
    prog = Program(dev, ParamLayout(SPEC), 8, 4)
    for l, lay in enumerate(prog.bwd.layers):
        monkeypatch.setattr(lay.gru, "steps_ops", lambda t0, t1, l=l: [_Tag(f"{l}:{t0}-{t1}")])
        monkeypatch.setattr(lay.dw_hh, "ops", lambda l=l: [_Tag(f"dW_hh {l}")])
    _, bwd = wavefront.batched_ops(dev, prog.layout, prog.buffers, prog.geometry, prog.fwd, prog.bwd, "fp32")
    sweeps = [f"{op.name}{'' if op.barrier else ' beside'}" for op in bwd if isinstance(op, _Tag)]
    if not dev.dispatches_concurrent:
        pytest.skip("kp without patch 0007: every dispatch in order")
    # each layer's dW_hh beside the sweeps of the wave after its last chunk (layer 0's: after the window)
    assert sweeps == ["2:6-8", "2:4-6", "1:6-8 beside", "2:2-4", "1:4-6 beside", "0:6-8 beside",
                      "2:0-2", "1:2-4 beside", "0:4-6 beside", "1:0-2", "0:2-4 beside", "dW_hh 2 beside",
                      "0:0-2", "dW_hh 1 beside", "dW_hh 0"]
    monkeypatch.setenv(wavefront.WAVE_BACKWARD_ENV, "0")  # the layer-by-layer backward, the wavefront forward
    _, bwd = wavefront.batched_ops(dev, prog.layout, prog.buffers, prog.geometry, prog.fwd, prog.bwd, "fp32")
    assert [op.name for op in bwd if isinstance(op, _Tag)][:3] == ["2:0-8", "1:0-8", "dW_hh 2"]
    for l, lay in enumerate(prog.fwd.gru):
        monkeypatch.setattr(lay, "steps_ops", lambda t0, t1, l=l: [_Tag(f"fwd {l}:{t0}-{t1}")])
    monkeypatch.setenv(wavefront.WAVE_FORWARD_ENV, "0")  # ... and the other way round
    monkeypatch.delenv(wavefront.WAVE_BACKWARD_ENV)
    fwd, bwd = wavefront.batched_ops(dev, prog.layout, prog.buffers, prog.geometry, prog.fwd, prog.bwd, "fp32")
    assert [op.name for op in fwd if isinstance(op, _Tag)] == ["fwd 0:0-8", "fwd 1:0-8", "fwd 2:0-8"]
    assert len([op for op in bwd if isinstance(op, _Tag)]) == 15  # the wavefront backward's, as above
    monkeypatch.setenv(wavefront.WAVE_FORWARD_ENV, "yes")
    with pytest.raises(UsageError, match="CATCHAT_WAVEFRONT_FORWARD"):
        wavefront.batched_ops(dev, prog.layout, prog.buffers, prog.geometry, prog.fwd, prog.bwd, "fp32")


def test_the_default_backward_wavefront_after_a_layer_by_layer_forward(dev, monkeypatch):
    """What a GPU runs by default where two backward sweeps fit (`default_chunks`): the forward layer by
    layer, the backward in 4 chunks (forced here: a CPU device's default is layer by layer), a training
    step against the reference."""
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    monkeypatch.setattr(wavefront, "default_chunks", lambda dev, g, k: 1 if k is None else wavefront.DEFAULT_CHUNKS)
    monkeypatch.delenv(wavefront.WAVE_ENV, raising=False)
    results = model_parity.model_parity(dev, SPEC, 8, 4, model_parity.MODEL_CASES[0][-1], label="backward wave")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    prog = Program(dev, ParamLayout(SPEC), 8, 4)
    info = wavefront.recording_info(prog.dev, prog.geometry, prog.fwd, prog.bwd)
    assert (info["wavefront_forward"], info["wavefront_backward"]) == (1, 4)


@pytest.mark.parametrize("persistent", ["1", "0"])
def test_wavefront_backward_matches_the_layer_by_layer_step(dev, monkeypatch, persistent):
    """A training step with the forward and backward as wavefronts of 4 chunks (persistent sweeps; a
    dispatch per step keeps the layer-by-layer backward): the reference's loss, gradients and update at the
    model parity's tolerances, and the layer-by-layer program's gradients to float32 rounding (the chunks'
    dW_ih and db_ih are summed chunk by chunk)."""
    monkeypatch.setenv("CATCHAT_PERSISTENT", persistent)
    hp = model_parity.MODEL_CASES[0][-1]
    monkeypatch.setenv(wavefront.WAVE_ENV, "4")
    results = model_parity.model_parity(dev, SPEC, 8, 4, hp, label="wavefront backward")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)

    def grads() -> np.ndarray:
        layout = ParamLayout(SPEC)
        flat, tokens, targets, resets, h0 = model_parity.model_inputs(SPEC, 8, 4, seed=6)
        prog = Program(dev, layout, 8, 4, optimizer=hp.optimizer)
        prog.set_params(flat)
        prog.set_carry(h0)
        prog.train_step([(tokens, targets, resets)], replace(hp, lr=0.0), global_step=0)
        return prog.read("grads")[0].copy()

    waved = grads()
    prog = Program(dev, ParamLayout(SPEC), 8, 4)
    beside = persistent == "1" and plan.OVERLAP_DEFAULT and dev.dispatches_concurrent  # beside persistent sweeps
    assert wavefront.recording_info(prog.dev, prog.geometry, prog.fwd, prog.bwd) == dict(
        wavefront_forward=4, wavefront_backward=4 if persistent == "1" else 1, dw_hh_beside=beside)
    monkeypatch.delenv(wavefront.WAVE_ENV)
    np.testing.assert_allclose(waved, grads(), rtol=2e-5, atol=1e-7)


def test_wavefront_backward_on_the_float32_streamed_sweeps(dev, monkeypatch):
    """v5's fp32 sweeps (streamed on the threads' FMAs, block flags; planned on a GPU only, forced here):
    both wavefronts over 4 chunks of an 8-step window at H = 32, a training step against the reference."""
    from catchat.vk.program import kernelsets

    monkeypatch.setattr(kernelsets, "stream_f32_sweep", lambda *a: True)
    monkeypatch.setattr(plan, "stream_f32_sweep", lambda *a: True)
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    monkeypatch.setenv(wavefront.WAVE_ENV, "4")
    spec, hp = replace(SPEC, hidden=32), model_parity.MODEL_CASES[0][-1]
    prog = Program(dev, ParamLayout(spec), 8, 4)
    assert prog.bwd.layers[0].gru.stream and prog.bwd.layers[0].gru.sweep_workgroups
    assert all(lay.gru.bias_sums is not None for lay in prog.bwd.layers)  # db_ih after the window, not by chunk
    results = model_parity.model_parity(dev, spec, 8, 4, hp, label="float32 streamed wavefront")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_the_groups_recorded_side_by_side_are_independent(dev, monkeypatch):
    """What a GPU runs at once, lavapipe runs in the recorded order. So each stage's groups recorded in the
    reverse order must give the same bits: none reads what another writes, or writes what another touches
    (a race on the GPU). Both wavefronts with dW_hh beside the sweeps, a training step."""
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    monkeypatch.setenv(wavefront.WAVE_ENV, "4")
    monkeypatch.setenv(plan.OVERLAP_ENV, "1")
    hp = replace(model_parity.MODEL_CASES[0][-1], lr=0.0)
    layout = ParamLayout(SPEC)
    flat, tokens, targets, resets, h0 = model_parity.model_inputs(SPEC, 8, 4, seed=9)
    resets[4, 1] = resets[2, 3] = 1  # resets at chunk boundaries: the state rows the sweeps zero

    def step() -> list:
        prog = Program(dev, layout, 8, 4, optimizer=hp.optimizer)
        prog.set_params(flat)
        prog.set_carry(h0)
        st = prog.train_step([(tokens, targets, resets)], hp, global_step=0)
        return [np.array([st.loss]), *(a.copy() for a in prog.read("grads", "h0"))]

    want = step()
    side_by_side = sequences.side_by_side
    monkeypatch.setattr(sequences, "side_by_side", lambda dev, groups: side_by_side(dev, groups[::-1]))
    for got, exp in zip(step(), want):
        np.testing.assert_array_equal(got, exp)


def test_the_default_wavefront_where_two_sweeps_fit_the_gpu(monkeypatch):
    """DEFAULT_CHUNKS for a training program whose backward sweeps are persistent, with float32 saves, over
    two layers or more, each on at most half the SMs; layer by layer otherwise (eval, float16 saves, one
    layer, sweeps a dispatch per step or on more than half the GPU, a CPU device); CATCHAT_WAVEFRONT wins.
    The forward likewise, where its sweeps stream with float32 saves ("stream32"), in training and eval
    programs alike; elsewhere only where CATCHAT_WAVEFRONT asks."""
    from types import SimpleNamespace as NS

    def bwd(*workgroups):
        return NS(layers=[NS(gru=NS(sweep_workgroups=w)) for w in workgroups])

    def fwd(*workgroups):
        return NS(gru=[NS(sweep_workgroups=w) for w in workgroups])

    def geometry(L=3, save16=False, products="mixed", T=1024):
        return NS(L=L, save16=save16, products=products, T=T)

    monkeypatch.delenv(wavefront.WAVE_ENV, raising=False)
    monkeypatch.delenv(wavefront.WAVE_FORWARD_ENV, raising=False)
    monkeypatch.setattr(wavefront, "device_sms", lambda dev: 132)
    assert wavefront.default_chunks(None, geometry(), bwd(64, 64, 64)) == wavefront.DEFAULT_CHUNKS == 4
    assert wavefront.default_chunks(None, geometry(L=2), bwd(66, 66)) == 4
    for g, k in ((geometry(), None), (geometry(save16=True), bwd(64, 64, 64)), (geometry(L=1), bwd(64)),
                 (geometry(), bwd(64, 0, 64)), (geometry(), bwd(64, 67, 64)), (geometry(), bwd(128, 128, 128))):
        assert wavefront.default_chunks(None, g, k) == 1, (g, k)
    assert wavefront.forward_chunks(None, geometry(products="stream32"), fwd(64, 64, 64)) == 4
    assert wavefront.forward_chunks(None, geometry(products="stream32", T=3), fwd(64, 64, 64)) == 3
    for g, f in ((geometry(), fwd(64, 64, 64)), (geometry(products="resident"), fwd(64, 64, 64)),
                 (geometry(products="stream"), fwd(64, 64, 64)), (geometry(L=1, products="stream32"), fwd(64)),
                 (geometry(products="stream32"), fwd(64, 67, 64)), (geometry(products="stream32"), fwd(64, 0, 64))):
        assert wavefront.forward_chunks(None, g, f) == 1, (g, f)
    monkeypatch.setattr(wavefront, "device_sms", lambda dev: 0)  # a CPU device
    assert wavefront.default_chunks(None, geometry(), bwd(1, 1, 1)) == 1
    assert wavefront.forward_chunks(None, geometry(products="stream32"), fwd(1, 1, 1)) == 1
    assert wavefront.wave_chunks(1024, 4) == 4 and wavefront.wave_chunks(3, 4) == 3 and wavefront.wave_chunks(8) == 1
    monkeypatch.setenv(wavefront.WAVE_ENV, "1")
    assert wavefront.wave_chunks(1024, 4) == 1
    monkeypatch.setenv(wavefront.WAVE_ENV, "8")
    assert wavefront.wave_chunks(1024, 4) == 8
    # CATCHAT_WAVEFRONT chunks any forward (unless CATCHAT_WAVEFRONT_FORWARD=0)
    assert wavefront.forward_chunks(None, geometry(products=None), fwd(0, 0, 0)) == 8
    monkeypatch.setenv(wavefront.WAVE_FORWARD_ENV, "0")
    assert wavefront.forward_chunks(None, geometry(products="stream32"), fwd(64, 64, 64)) == 1
