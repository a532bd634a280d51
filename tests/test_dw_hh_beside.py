"""Layer l's dW_hh GEMM beside layer l-1's backward sweep (Geometry.overlap_dw_hh, issue 35): recorded
right after that sweep without the barrier between them, its split-K partials in `ws` (the sweep reads
do from x[L] meanwhile), and the same gradients bit for bit as the layer-by-layer order
(CATCHAT_OVERLAP_DW=0; beside is the default). Lavapipe runs the two one after the
other, so what it checks is the order, the workspace and the results; the GPU runs them side by side."""

from dataclasses import replace

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout
from catchat.parity import model as model_parity
from catchat.vk.program import Program, plan, sequences, wavefront

SPEC = ModelSpec(vocab_size=101, hidden=12, layers=3)


def _step(dev, T=7, B=3):
    """A program after one training step at the model parity's first case: (program, grads, params)."""
    layout = ParamLayout(SPEC)
    flat, tokens, targets, resets, h0 = model_parity.model_inputs(SPEC, T, B, seed=3)
    _, _, _, _, hp = model_parity.MODEL_CASES[0]
    prog = Program(dev, layout, T, B, optimizer=hp.optimizer)
    prog.set_params(flat)
    prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    prog.set_carry(h0)
    prog.train_step([(tokens, targets, resets)], hp, global_step=0)
    grads, params = prog.read("grads", "params")
    return prog, grads.copy(), params.copy()


@pytest.fixture
def persistent(monkeypatch):
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")  # the overlap needs a persistent sweep below
    monkeypatch.setenv(plan.OVERLAP_ENV, "1")


class Tag:
    """A stand-in dispatch: its name, and the barrier `Device.beside` clears."""

    def __init__(self, name: str):
        self.name, self.barrier = name, True


def test_dw_hh_is_recorded_beside_the_sweep_below(dev, persistent, monkeypatch):
    if not dev.dispatches_concurrent:
        pytest.skip("kp without patch 0007 records every dispatch with its barrier")
    prog = Program(dev, ParamLayout(SPEC), 5, 2)
    assert prog.geometry.overlap_dw_hh
    assert wavefront.recording_info(prog.dev, prog.geometry, prog.fwd, prog.bwd)["dw_hh_beside"]
    k = prog.bwd
    assert all(getattr(lay.dw_hh, "work", None) in (None, prog.buffers.ws) for lay in k.layers)
    for l, lay in enumerate(k.layers):  # tag the sweeps' and the dW_hh GEMMs' dispatches
        assert len(lay.gru.sweep_ops()) == 1
        monkeypatch.setattr(lay.gru, "sweep_ops", lambda l=l: [Tag(f"sweep {l}")])
        monkeypatch.setattr(lay.dw_hh, "ops", lambda l=l: [Tag(f"dW_hh {l}"), Tag(f"dW_hh {l} reduce")])

    def names(ops) -> list[str]:
        return [f"{op.name}{'' if op.barrier else ' (beside)'}" for op in ops if isinstance(op, Tag)]

    assert names(sequences.backward_ops(k, dev)) == [
        "sweep 2", "sweep 1", "dW_hh 2 (beside)", "dW_hh 2 reduce", "sweep 0", "dW_hh 1 (beside)",
        "dW_hh 1 reduce", "dW_hh 0", "dW_hh 0 reduce"]
    # without dev (the exchange's groups, whose ranges follow the layers) each in its layer's place
    assert names(sequences.backward_ops(k)) == [
        "sweep 2", "dW_hh 2", "dW_hh 2 reduce", "sweep 1", "dW_hh 1", "dW_hh 1 reduce", "sweep 0", "dW_hh 0",
        "dW_hh 0 reduce"]


def test_beside_gives_the_layer_by_layer_gradients(dev, persistent, monkeypatch):
    prog, grads, params = _step(dev)
    overlap = prog.geometry.overlap_dw_hh
    monkeypatch.setenv(plan.OVERLAP_ENV, "0")
    prog0, grads0, params0 = _step(dev)
    assert not prog0.geometry.overlap_dw_hh
    assert overlap == dev.dispatches_concurrent
    np.testing.assert_array_equal(grads, grads0)
    np.testing.assert_array_equal(params, params0)


def test_the_workspace_holds_dw_hh_beside():
    """Split over K, dW_hh's partials [S, 3H, H] fit x[L] [T,B,H]; beside the sweep below they go to ws."""
    g = plan.Geometry(T=64, B=8, H=16, L=3, V=101, P=1, split_w=4)
    assert g.split_in_x and g.ws_words() == 1
    assert replace(g, overlap_dw_hh=True).ws_words() == 4 * 3 * 16 * 16


def test_overlap_env_is_checked(dev, monkeypatch):
    monkeypatch.setenv(plan.OVERLAP_ENV, "yes")
    with pytest.raises(UsageError, match="CATCHAT_OVERLAP_DW"):
        plan.overlaps_dw_hh(dev, "resident", 3)
    monkeypatch.setenv(plan.OVERLAP_ENV, "1")
    assert not plan.overlaps_dw_hh(dev, "stream", 3)  # float16 saves: dW_hh reads gi, which the sweep writes
    assert not plan.overlaps_dw_hh(dev, None, 1)
    monkeypatch.delenv(plan.OVERLAP_ENV)
    assert plan.overlaps_dw_hh(dev, "resident", 3) == (plan.OVERLAP_DEFAULT and dev.dispatches_concurrent)


def test_split_dw_hh_beside_keeps_its_partials_in_ws(dev, persistent, monkeypatch):
    """split-K 2 forced (T*B = 80 rows: the layers' partials would fit x[L]): beside the sweep below, dW_hh's
    go to ws, dW_ih's still to x[L]; one training step against the reference."""
    if not dev.dispatches_concurrent:
        pytest.skip("kp without patch 0007 records every dispatch with its barrier")
    monkeypatch.setattr(plan, "gemm_split_k", lambda dev, M, N, K: 2)
    spec = ModelSpec(vocab_size=101, hidden=8, layers=2)
    prog = Program(dev, ParamLayout(spec), 16, 5)
    b, g = prog.buffers, prog.geometry
    assert g.overlap_dw_hh and g.split_in_x
    assert all(lay.dw_hh.work is b.ws for lay in prog.bwd.layers) and prog.bwd.layers[1].dw_ih.work is b.x[-1]
    assert b.ws.size() == 2 * 24 * 8
    hp = model_parity.MODEL_CASES[0][-1]
    results = model_parity.model_parity(dev, spec, 16, 5, hp, label="split-K dW_hh beside")
    assert not [r for r in results if not r.ok], "\n".join(str(r) for r in results if not r.ok)


def test_dw_hh_and_the_sweep_below_are_independent(dev, persistent, monkeypatch):
    """Lavapipe runs in the recorded order what a GPU runs at once: dW_hh recorded before the sweep below
    instead of after it gives the same bits (neither reads what the other writes)."""
    _, grads, params = _step(dev)
    side_by_side = sequences.side_by_side
    monkeypatch.setattr(sequences, "side_by_side", lambda dev, groups: side_by_side(dev, groups[::-1]))
    _, grads_r, params_r = _step(dev)
    np.testing.assert_array_equal(grads_r, grads)
    np.testing.assert_array_equal(params_r, params)
