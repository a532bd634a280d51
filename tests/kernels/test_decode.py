"""Generation's decode step and on-device choice against catchat.model.reference (catchat/parity/decode.py),
plus the edges a parity table does not show."""

import numpy as np
import pytest

from catchat.data import vocab
from catchat.inference.generate import Sampling
from catchat.model import ModelSpec
from catchat.model import reference as ref
from catchat.parity import decode as decode_parity
from catchat.vk.kernels.gru.stream import w_frag_order
from catchat.vk.program.decoder import decode_step


def _generate(dev, H: int, L: int, B: int, kind: str = "coop"):
    """12 tokens a stream of a seeded generation on `kind`'s step (the environment the test set):
    (the generator, (its tokens, its last logits, its carried state))."""

    with decode_step(kind):
        gen, _ = decode_parity._generator(dev, ModelSpec(hidden=H, layers=L), B, 7)
        prompt = np.array([vocab.BOS] + list(vocab.encode("JULIET: ").ids), np.uint32)
        outs = gen.generate(prompt, 12, Sampling(temperature=1.0), seed=3, stop_at=None)
    return gen, (outs, gen.logits.copy(), gen.prog.get_carry())


def _assert_same_bits(a, b):
    """Two `_generate` results: the same tokens, logits and state bit for bit."""
    assert a[0] == b[0]
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], b[2])


def test_parity(dev):
    results = decode_parity.parity_checks(dev)
    assert results and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    # the tensor-core step ran with its weights in both orders (blocks, fragment order)
    other = "(coop, W in fragment order)" if not w_frag_order() else "(coop, W in blocks)"
    assert sum(other in r.kernel for r in results) >= 4


def test_coop_step_reads_the_weights_in_the_order_they_were_written(dev, monkeypatch):
    """Fragment order read as blocks (or the reverse) is another matrix: the step's twin catches it."""
    from catchat.vk.kernels import FragOrder

    monkeypatch.setenv("CATCHAT_FRAG_W", "1")
    monkeypatch.setattr(FragOrder, "ops", lambda self: [])  # the copy left in blocks
    with decode_step("coop"):
        rows = decode_parity._step_case(dev, 48, 2, 3, False, 2, "coop")
    assert rows and not all(r.ok for r in rows)


def test_non_finite_logits_stop_the_stream_on_both_sides(dev):
    """Nothing to choose from (NaN logits): <eos>, on the device and in the twin."""
    gen, _ = decode_parity._generator(dev, ModelSpec(hidden=16, layers=1), 2, 0)
    logits = np.full((2, vocab.VOCAB_SIZE), np.nan, np.float32)
    allowed = np.ones(logits.shape, bool)
    for s in (Sampling(greedy=True), Sampling(temperature=1.0, top_p=0.5)):
        gen.logits = logits
        assert gen.generate(None, 5, s, seed=1) == [[vocab.EOS], [vocab.EOS]]
        twin, _ = ref.sample_choice(logits, np.zeros(2, np.float32), allowed, inv_temp=s.inv_temperature,
                                    top_p=s.top_p, greedy=s.is_greedy)
        assert twin.tolist() == [vocab.EOS, vocab.EOS]


def test_a_stopped_stream_keeps_its_state_while_others_run(dev):
    """Stream 0 stops at once (only <eos> allowed by the logits it starts from); stream 1 runs 20
    steps. Stream 0's state and logits are those it stopped with."""
    gen, _ = decode_parity._generator(dev, ModelSpec(hidden=24, layers=2), 2, 3)
    gen.feed(np.array([vocab.BOS, 40, 41], np.uint32))
    before_h, before_logits = gen.prog.get_carry(), gen.logits.copy()
    logits = before_logits.copy()
    logits[0] = -1e30
    logits[0, vocab.EOS] = 0.0
    gen.logits = logits
    outs = gen.generate(None, 20, Sampling(temperature=1.0), seed=2)
    assert outs[0] == [vocab.EOS]
    assert len(outs[1]) == 20 or outs[1][-1] == vocab.EOS
    h = gen.prog.get_carry()
    np.testing.assert_array_equal(h[:, 0], before_h[:, 0])
    np.testing.assert_array_equal(gen.logits[0], logits[0])
    assert not np.array_equal(h[:, 1], before_h[:, 1])


def test_ngram_blocking_over_a_long_output_grows_the_history(dev):
    """An n-gram history longer than the decoder holds rebuilds it (256 -> 1024 tokens); no 3-gram
    repeats over 600 greedy tokens of a model that loops, and the short call before is unchanged."""
    gen, _ = decode_parity._generator(dev, ModelSpec(hidden=24, layers=1), 1, 5, peaky=8.0)
    prompt = np.array([vocab.BOS, 40], np.uint32)
    s = Sampling(greedy=True, ngram_block=3)
    short = gen.generate(prompt, 100, s, stop_at=None)[0]
    assert gen._decoder.cap == 256
    gen.reset()
    long = gen.generate(prompt, 600, s, stop_at=None)[0]
    assert gen._decoder.cap == 1024 and len(long) == 600 and long[:100] == short
    grams = [tuple(long[i:i + 3]) for i in range(len(long) - 2)]
    assert len(grams) == len(set(grams))
    gen.reset()
    plain = gen.generate(prompt, 600, Sampling(greedy=True), stop_at=None)[0]
    assert len({tuple(plain[i:i + 3]) for i in range(598)}) < 598  # unblocked greedy repeats


def test_a_failed_submit_is_a_device_lost_error(dev):
    """kp's RuntimeError from a chunk's submit or wait reaches the caller as DeviceLost (a one-line
    error in the CLI), not a traceback."""
    from catchat.errors import DeviceLost

    gen, _ = decode_parity._generator(dev, ModelSpec(hidden=16, layers=1), 1, 0)
    gen.generate(np.array([vocab.BOS], np.uint32), 4, Sampling())

    class Lost:
        def eval(self):
            raise RuntimeError("vk::Queue::submit: ErrorDeviceLost")

        eval_async = eval_await = eval

    gen._decoder.seq_chunks = [Lost(), Lost()]
    with pytest.raises(DeviceLost, match="failed while running generation: vk::Queue::submit"):
        gen.generate(np.array([vocab.BOS], np.uint32), 40, Sampling(), stop_at=None)


def test_coop_step_holds_its_twin_at_every_streams_per_workgroup(dev, monkeypatch):
    """CATCHAT_DECODE_COOP_STREAMS: 16, 32 or 64 streams a workgroup (so 4, 4 and 2 k parts at H = 64),
    each within the coop rows' tolerances of the float16-operand twin over 40 streams; other values
    refused; unset, by H."""
    from catchat.errors import UsageError
    from catchat.vk.kernels import decode as dk

    for streams, shape in ((16, (1, 4, 3)), (32, (2, 4, 2)), (64, (3, 2, 1))):
        monkeypatch.setenv(dk.COOP_STREAMS_ENV, str(streams))
        assert (lambda s: (s.sf, s.ks, s.tiles))(dk.CoopShape.of(64, 40, dk.coop_streams(64))) == shape
        with decode_step("coop"):
            rows = decode_parity._step_case(dev, 64, 2, 40, False, 21, "coop")
        assert all(r.ok for r in rows), "\n".join(str(r) for r in rows)
    monkeypatch.setenv(dk.COOP_STREAMS_ENV, "48")
    with pytest.raises(UsageError, match="CATCHAT_DECODE_COOP_STREAMS"):
        dk.coop_streams(64)
    monkeypatch.delenv(dk.COOP_STREAMS_ENV)  # unset: 32 where a layer's weights fit L2 (v3), 64 above (v5)
    assert dk.coop_streams(512) == dk.coop_streams(1024) == 32 and dk.coop_streams(2048) == 64


def test_coop_step_with_16_subgroups(dev, monkeypatch):
    """16 subgroups a workgroup: twice the k parts where the streams leave room (past 8 subgroups, or
    8 parts, they meet through one shared slot in turn: SEQ, a ring of 2 stages), each shape within
    the coop rows' tolerances of the float16-operand twin. Unset, 16 above H = 1024 (the 64-stream
    workgroups) and 8 up to it; CATCHAT_DECODE_COOP_SUBGROUPS sets it."""
    from catchat.errors import UsageError
    from catchat.vk.kernels import decode as dk

    assert (dk.coop_subgroups(2048), dk.coop_subgroups(1024), dk.coop_subgroups(512)) == (16, 8, 8)
    v5, v3 = dk.CoopShape.of(2048, 64, 64, 16), dk.CoopShape.of(512, 64, 32, 8)
    assert (v5.sf, v5.ks, v5.seq, v5.workgroup) == (4, 4, True, 512) and (v3.sf, v3.ks, v3.seq) == (2, 4, False)
    monkeypatch.setenv(dk.COOP_SUBGROUPS_ENV, "8")
    assert (dk.CoopShape.of(2048, 64, 64, dk.coop_subgroups(2048)).ks, dk.coop_subgroups(512)) == (2, 8)
    monkeypatch.setenv(dk.COOP_SUBGROUPS_ENV, "16")
    v3 = dk.CoopShape.of(512, 64, 32, dk.coop_subgroups(512))
    assert (v3.sf, v3.ks, v3.seq) == (2, 8, True)
    assert v5.defines() == {"SF": 4, "KS": 4, "SEQ": 1, "PD": 2}
    # H = 128: 8 k fragments; 16 streams a workgroup -> 8 parts of 1, 32 -> 2 x 8, 64 -> 3 fragments x 4
    for streams, shape in ((16, (1, 8, True)), (32, (2, 8, True)), (64, (3, 4, True))):
        monkeypatch.setenv(dk.COOP_STREAMS_ENV, str(streams))
        got = dk.CoopShape.of(128, 40, dk.coop_streams(128), dk.coop_subgroups(128))
        assert (got.sf, got.ks, got.seq) == shape
        with decode_step("coop"):
            rows = decode_parity._step_case(dev, 128, 2, 40, False, 21, "coop")
        assert all(r.ok for r in rows), "\n".join(str(r) for r in rows)
    monkeypatch.setenv(dk.COOP_SUBGROUPS_ENV, "12")
    with pytest.raises(UsageError, match="CATCHAT_DECODE_COOP_SUBGROUPS"):
        dk.coop_subgroups(128)


def test_coop_step_parts_in_turn_are_the_same_sums(dev, monkeypatch):
    """SEQ (the k parts through one slot in turn) adds them in the same order as a slot per part: the
    same tokens, logits and state bit for bit (16 streams a workgroup, 4 parts, H = 128)."""
    from catchat.vk.kernels import decode as dk

    monkeypatch.setenv(dk.COOP_STREAMS_ENV, "16")
    plain = dk.CoopShape.of(128, 16, 16)
    assert (plain.sf, plain.ks, plain.seq) == (1, 4, False)
    got = []
    for seq in (False, True):
        forced = dk.CoopShape(1, 4, 1, 128 // 16, seq)
        monkeypatch.setattr(dk.CoopShape, "of", staticmethod(lambda *a, forced=forced: forced))
        gen, result = _generate(dev, 128, 2, 16)
        assert gen._decoder.step.layer.shape.seq == seq
        got.append(result)
    _assert_same_bits(*got)


def test_coop_probe_is_a_measurement_of_real_fragments_only(monkeypatch):
    """CATCHAT_DECODE_COOP_PROBE (1: no W loads, 2: no h16 / y16 loads; wrong results) runs only on real
    fragments; on emulated ones, or a value outside 0-2, it is refused by name."""
    from catchat.errors import UsageError
    from catchat.vk.kernels import decode

    monkeypatch.delenv(decode.PROBE_ENV, raising=False)
    assert decode.coop_probe(real_fragments=False) == 0
    for value in ("1", "2"):
        monkeypatch.setenv(decode.PROBE_ENV, value)
        assert decode.coop_probe(real_fragments=True) == int(value)
        with pytest.raises(UsageError, match=decode.PROBE_ENV):
            decode.coop_probe(real_fragments=False)
    monkeypatch.setenv(decode.PROBE_ENV, "3")
    with pytest.raises(UsageError, match="is not one of 0, 1, 2"):
        decode.coop_probe(real_fragments=True)
