"""Generation: the choice's host twin (`choose`), the GPU generator against numpy, and `catchat sample`
end to end. The device's choice against the twin, rule by rule, is catchat/parity/decode.py.

Lesson 9 of design.md: the predecessor's --temperature flag was silently ignored, so every
sampling flag here is checked to change (or, for top-k 1 vs greedy, not change) the text.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from catchat.data import vocab
from catchat.errors import UsageError
from catchat.inference.generate import Generator, Sampling, check_speaker, checkpoint_spec, choose, prompt_ids
from catchat.model import reference as ref
from catchat.run import checkpoint as ck

from support import load_tool, make_tiny_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(dev, tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("gen"), dev)


@pytest.fixture(params=["fused", "fused16", "batched", "coop", "persistent"])
def decode_step(request, monkeypatch):
    """Each generator test on every decode step (catchat/vk/program/decoder.py): the fused layer
    kernels, on float32 and on float16 weights, the batched forward at T = 1, the layers on tensor
    cores (emulated fragments here), and a chunk in one dispatch (persistent16 is fused16's kernels the
    same way: test_persistent_steps_make_the_fused_steps_bits)."""
    monkeypatch.setenv("CATCHAT_DECODE", request.param)
    return request.param


def ngrams(ids, n):
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


# ------------------------------------------------------------------------------ choose (host only)
def draws(n, seed):
    return np.random.default_rng(seed).random(n).astype(np.float32)


def test_top_k_1_equals_greedy_and_ignores_the_draw():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, vocab.VOCAB_SIZE))
    logits[:8, 40] = logits[:8, 30] = 9.0  # ties: both take the lower index
    greedy = choose(logits, Sampling(greedy=True), draws(64, 0))
    assert (greedy[:8] == 30).all()
    for t in (0.3, 1.0, 5.0):
        for seed in range(3):
            np.testing.assert_array_equal(choose(logits, Sampling(temperature=t, top_k=1), draws(64, seed)), greedy)
    np.testing.assert_array_equal(choose(logits, Sampling(temperature=0.0), draws(64, 1)), greedy)


def test_never_pad_or_bos_and_top_k_top_p_limit_the_choice():
    logits = np.zeros((4000, vocab.VOCAB_SIZE))
    logits[:, vocab.PAD] = logits[:, vocab.BOS] = 50.0  # most likely, still never chosen
    logits[:, 10:14] = [3.0, 2.9, 2.8, -1.0]
    u = draws(4000, 1)
    picks = choose(logits, Sampling(temperature=1.0), u)
    assert not np.isin(picks, [vocab.PAD, vocab.BOS]).any()
    assert set(choose(logits, Sampling(temperature=1.0, top_k=3), u)) == {10, 11, 12}
    p = np.exp([3.0, 2.9, 2.8])
    # nucleus: 10 alone holds < 0.45 of the mass of everything, 10+11 more
    top_p = float(p[0] / (p.sum() + np.exp(-1.0) + 95))
    assert set(choose(logits, Sampling(temperature=1.0, top_p=top_p * 1.01), u)) == {10, 11}


def test_temperature_changes_the_draws():
    logits = np.random.default_rng(3).standard_normal((256, vocab.VOCAB_SIZE)) * 2
    u = draws(256, 7)
    a = choose(logits, Sampling(temperature=0.5), u)
    b = choose(logits, Sampling(temperature=2.0), u)
    assert (a != b).mean() > 0.2
    hot = [choose(logits, Sampling(temperature=t), u) for t in (0.05, 0.5, 2.0)]
    agree = [(h == logits[:, 2:].argmax(1) + 2).mean() for h in hot]
    assert agree[0] > agree[1] > agree[2]  # colder is greedier


def test_the_draw_picks_by_running_sum_in_index_order():
    """u * sum p falls in token v's share of the running sum: the choice moves with u, in index order."""
    logits = np.full((1, vocab.VOCAB_SIZE), -np.inf)
    logits[0, [10, 20, 30]] = 0.0  # three equal shares
    picks = [int(choose(logits, Sampling(temperature=1.0), np.array([u], np.float32))[0])
             for u in (0.0, 0.3, 0.34, 0.66, 0.67, 0.999)]
    assert picks == [10, 10, 20, 20, 30, 30]


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("greedy", [True, False])
def test_ngram_block_never_repeats_an_ngram(n, greedy):
    """Logits that strongly prefer a 3-token cycle: without blocking the cycle repeats at once."""
    B, V = 3, vocab.VOCAB_SIZE
    s = Sampling(temperature=0.7, greedy=greedy, ngram_block=n)
    rng = np.random.default_rng(n)
    out = [[] for _ in range(B)]
    last = np.full(B, 6)
    for _ in range(200):
        logits = rng.standard_normal((B, V)) * 0.1 - 5.0
        logits[:, vocab.EOS] = -40.0
        logits[np.arange(B), 6 + (last - 6 + 1) % 3] = 10.0  # prefer the next of 6, 7, 8
        banned = np.stack([ref.ngram_banned(o, n, V, (vocab.EOS,)) for o in out])
        last = choose(logits, s, rng.random(B).astype(np.float32), banned)
        for b in range(B):
            out[b].append(int(last[b]))
    for b in range(B):
        grams = [g for g in ngrams(out[b], n) if vocab.EOS not in g]
        assert len(grams) == len(set(grams)), f"stream {b} repeats an {n}-gram"
        assert len(set(out[b])) > 3  # it had to leave the cycle
    plain = [int(x) for x in np.concatenate([[6], np.arange(7, 9)] * 5)]
    assert len(set(ngrams(plain, n))) < len(ngrams(plain, n))  # the cycle itself does repeat


def test_ngram_banned_follows_the_history_and_exempts_stops():
    V = vocab.VOCAB_SIZE
    assert np.flatnonzero(ref.ngram_banned([10, 11, 10], 2, V)).tolist() == [11]  # after 10, 11 was taken
    assert not ref.ngram_banned([10], 2, V).any()  # one token: no bigram yet
    assert np.flatnonzero(ref.ngram_banned([10, 11, 12, 10, 11], 3, V)).tolist() == [12]
    hist = [10, vocab.TURN, 10, vocab.EOS, 10]
    assert not ref.ngram_banned(hist, 2, V, (vocab.TURN, vocab.EOS))[[vocab.TURN, vocab.EOS]].any()
    assert ref.ngram_banned(hist, 2, V, (vocab.EOS,))[vocab.TURN]


def test_sampling_and_speaker_validation():
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(ngram_block=1)):
        with pytest.raises(UsageError):
            Sampling(**bad)
    assert check_speaker("  Lady \t Macbeth ") == "Lady Macbeth"
    for bad in ("", "A: B", "Zo\u00eb", "x" * 61):
        with pytest.raises(UsageError):
            check_speaker(bad)


# ------------------------------------------------------------------------------ the GPU generator
def test_generator_logits_match_the_reference(dev, run_dir, decode_step):
    """The forward-only T=1 program, and the prefill window, against the float64 numpy model."""
    ckpt = ck.load_checkpoint(run_dir)
    spec = checkpoint_spec(ckpt)
    ids = prompt_ids("ALICE: Where is the cat?<turn>BOB: Asleep on the mat, as ever, as ever and ever.")
    ids = np.concatenate([ids, prompt_ids("ALICE: again")])  # a second <bos> mid-stream: state reset
    assert len(ids) > 64
    T = len(ids)
    p64 = {k: v.astype(np.float64) for k, v in ckpt.params.items()}
    want = ref.model_forward_backward(p64, spec, ids[:, None], np.zeros((T, 1), np.uint32),
                                      (ids == vocab.BOS).astype(np.uint32)[:, None],
                                      np.zeros((spec.layers, 1, spec.hidden)), 1, need_grads=False).logits[:, 0]
    step = Generator.from_checkpoint(dev, ckpt, prefill=0)
    got = np.stack([step.feed(ids[t:t + 1])[0] for t in range(T)])
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
    pre = Generator.from_checkpoint(dev, ckpt)  # 64 tokens in one window, then one at a time
    np.testing.assert_allclose(pre.feed(ids)[0], want[-1], atol=2e-4, rtol=1e-4)
    pre.reset()
    np.testing.assert_allclose(pre.feed(ids[:5])[0], want[4], atol=2e-4, rtol=1e-4)


def test_same_seed_same_text_and_stop_tokens(dev, run_dir, decode_step):
    ckpt = ck.load_checkpoint(run_dir)
    gen = Generator.from_checkpoint(dev, ckpt, streams=4)
    s = Sampling(temperature=1.0)
    a = gen.generate(prompt_ids("BOB: "), 60, s, seed=5)
    gen.reset()
    b = gen.generate(prompt_ids("BOB: "), 60, s, seed=5)
    gen.reset()
    c = gen.generate(prompt_ids("BOB: "), 60, s, seed=6)
    assert a == b and a != c
    assert len({tuple(x) for x in a}) == 4  # the streams differ
    gen.reset()
    outs = gen.generate(prompt_ids("BOB: "), 200, Sampling(temperature=2.0), seed=1, stop_at=(vocab.TURN,))
    for o in outs:
        stops = [i for i, t in enumerate(o) if t in (vocab.TURN, vocab.EOS)]
        assert stops in ([], [len(o) - 1]) and (stops or len(o) == 200)
        assert vocab.PAD not in o and vocab.BOS not in o


def test_text_does_not_depend_on_the_chunk_and_streams_in_chunks(dev, run_dir, decode_step):
    """The draws are keyed by (seed, stream, token number): 2, 6 or 64 tokens per submit give the same
    text; on_tokens sees it chunk by chunk, <pad> once a stream has stopped."""
    ckpt = ck.load_checkpoint(run_dir)
    s = Sampling(temperature=1.2, top_k=30, ngram_block=4)
    texts, seen = [], []
    for chunk in (2, 6, 64):
        gen = Generator.from_checkpoint(dev, ckpt, streams=3, chunk=chunk)
        rows = []
        texts.append(gen.generate(prompt_ids("ALICE: Where"), 90, s, seed=11, stop_at=(vocab.TURN,),
                                  on_tokens=rows.append))
        assert all(r.shape[1] == 3 and len(r) <= chunk for r in rows)
        seen.append(np.concatenate(rows))
    assert texts[0] == texts[1] == texts[2]
    for b, out in enumerate(texts[0]):
        streamed = seen[0][:, b]
        assert streamed[:len(out)].tolist() == out and (streamed[len(out):] == vocab.PAD).all()


def test_a_calls_first_chunk_ends_a_few_choices_past_its_forced_tokens(dev, run_dir):
    """The first text of a call reaches the host FIRST_CHOICES steps after its forced tokens, not a whole
    chunk later: the rows come 1, then first_chunk(K, n) (even, at most K), then K at a time."""
    from catchat.inference.generate import decode_settings
    from catchat.vk.program import decoder as dm

    assert dm.FIRST_CHOICES == 2
    assert [dm.first_chunk(64, n) for n in (0, 1, 2, 5, 6, 100)] == [2, 2, 4, 6, 8, 64]
    gen = Generator.from_checkpoint(dev, ck.load_checkpoint(run_dir), streams=2, chunk=16)
    dec = gen._decoder_for(1)
    forced = np.array([prompt_ids("ALICE: Hi")[:5]] * 2, np.uint32).T  # [5, 2]
    rows = list(dec.run(decode_settings(Sampling(), 0, 40, None), forced, None, 5 + 40))  # None: no stop token
    assert [len(r) for r in rows] == [1, 6, 16, 16, 16]
    made = np.concatenate(rows)[5:]  # after the forced tokens: every stream sampled from step 5 on
    assert (made[:40] != dm.NONE).all()


def test_state_after_generate_continues_like_feeding_the_text(dev, run_dir, decode_step):
    """generate() leaves the state just before its last token: feeding that token then gives the
    same logits as feeding the prompt and the whole output in one go."""
    ckpt = ck.load_checkpoint(run_dir)
    gen = Generator.from_checkpoint(dev, ckpt)
    prompt = prompt_ids("BOB: The cat")
    out = gen.generate(prompt, 70, Sampling(temperature=0.9), seed=4)[0]
    after = gen.feed(np.array(out[-1:], np.uint32))
    fresh = Generator.from_checkpoint(dev, ckpt, prefill=16)
    np.testing.assert_allclose(after, fresh.feed(np.concatenate([prompt, out]).astype(np.uint32)),
                               atol=2e-5, rtol=1e-4)


def test_batched_and_fused_steps_generate_the_same(dev, run_dir, monkeypatch):
    """The two decode steps are the same model: greedy, from a prompt with a <bos> mid-way (a reset
    inside the forced tokens), 5 streams of which some stop at a stop token and one at its length,
    the same tokens; the last logits (a stopped stream keeps its own) and the state left behind
    within float32 rounding of each other; the batched step's profile names its groups."""
    ckpt = ck.load_checkpoint(run_dir)
    prompt = np.concatenate([prompt_ids("ALICE: Where"), prompt_ids("BOB: The")])
    got = {}
    for kind in ("fused", "batched"):
        monkeypatch.setenv("CATCHAT_DECODE", kind)
        gen = Generator.from_checkpoint(dev, ckpt, streams=5, prefill=4, chunk=4)
        outs = gen.generate(prompt, 40, Sampling(temperature=1.5), seed=3, stop_at=(vocab.TURN,))
        got[kind] = outs, gen.logits.copy(), gen.prog.read("h0")[0].copy(), gen
    (a, la, ha, _), (b, lb, hb, gen) = got["fused"], got["batched"]
    assert a == b
    assert len({len(o) for o in a}) > 1 and min(len(o) for o in a) < 40  # streams stopped at different steps
    np.testing.assert_allclose(lb, la, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(hb, ha, atol=2e-5, rtol=1e-5)
    assert gen._decoder.kind == "batched"
    assert list(gen.profile(4)) == [f"layer {l}" for l in range(gen.spec.layers)] + ["head", "choice"]


def test_batched_step_reports_a_lost_persistent_sweep(dev, run_dir, monkeypatch):
    """A persistent sweep of the batched step whose grid barrier gave up (its stats word, as the GPU
    would count it) stops generation with the Program's DeviceLost, not with garbage tokens."""
    from catchat.errors import DeviceLost
    from catchat.vk import slots
    from catchat.vk.device import host_view

    monkeypatch.setenv("CATCHAT_DECODE", "batched")
    gen = Generator.from_checkpoint(dev, ck.load_checkpoint(run_dir), streams=2, chunk=4)
    step = gen._decoder_for(1).step
    stats = step.one.buffers.stats
    host_view(stats)[slots.ST_SYNC_TIMEOUTS] = 1
    dev.upload([stats])
    with pytest.raises(DeviceLost, match="lost its workgroups"):
        gen.generate(prompt_ids("BOB: "), 20, Sampling(), seed=1)


@pytest.mark.parametrize("kind", ["persistent", "persistent16"])
def test_persistent_steps_make_the_fused_steps_bits(dev, run_dir, monkeypatch, kind):
    """A chunk in one dispatch runs the fused step's kernels' bodies (glsl/include/decode_*_body.glsl), so
    the same bits: 5 streams from a prompt with a <bos> mid-way, some stopping at a stop token, one at
    its length, two chunk lengths (a call's short first chunk, then whole ones): the same tokens, and the
    last logits and the state left behind equal bit for bit; its profile is the step as a whole."""
    ckpt = ck.load_checkpoint(run_dir)
    prompt = np.concatenate([prompt_ids("ALICE: Where"), prompt_ids("BOB: The")])
    got = {}
    for k in (kind.replace("persistent", "fused"), kind):
        monkeypatch.setenv("CATCHAT_DECODE", k)
        gen = Generator.from_checkpoint(dev, ckpt, streams=5, prefill=4, chunk=6)
        outs = gen.generate(prompt, 40, Sampling(temperature=1.5), seed=3, stop_at=(vocab.TURN,))
        got[k] = outs, gen.logits.copy(), gen.prog.read("h0")[0].copy(), gen
    (a, la, ha, _), (b, lb, hb, gen) = got.values()
    assert a == b
    assert len({len(o) for o in a}) > 1 and min(len(o) for o in a) < 40  # streams stopped at different steps
    np.testing.assert_array_equal(lb, la)
    np.testing.assert_array_equal(hb, ha)
    assert gen._decoder.kind == kind
    if dev.info.type == "CPU":
        assert gen.layer_shape()["grid"] == 1  # lavapipe: one workgroup does it all (a GPU's grid crosses)
    profile = gen.profile(4)
    assert list(profile) == ["step"] and profile["step"] > 0


def test_a_long_persistent_chunk_stays_within_lavapipes_loop_limit(dev, run_dir, monkeypatch):
    """lavapipe ends a shader's loops after 65,535 iterations in all: a chunk of 256 steps at 2 streams,
    which one workgroup runs whole on a CPU device, stopped making tokens after ~249 steps. On a CPU
    device the decoder now takes fewer steps a dispatch (the same text: the draws do not depend on the
    chunk), and refuses where two steps would pass the limit."""
    from catchat.vk.device import LAVAPIPE_LOOP_LIMIT
    from catchat.vk.kernels.decode_persistent import PersistentPlan, steps_within_loop_limit

    ckpt = ck.load_checkpoint(run_dir)
    got = {}
    for kind in ("fused", "persistent"):
        monkeypatch.setenv("CATCHAT_DECODE", kind)
        gen = Generator.from_checkpoint(dev, ckpt, streams=2, chunk=256)
        got[kind] = gen.generate(prompt_ids("ALICE: Where"), 300, Sampling(temperature=1.5), seed=3, stop_at=())
    assert got["persistent"] == got["fused"] and max(len(o) for o in got["fused"]) == 300  # (<eos> may end one)
    K = gen._decoder.K
    assert (K < 256 and K % 2 == 0) if dev.loop_limit else K == 256
    per_step = PersistentPlan.of(dev, 64, 2, 101).loop_iterations(2, 1)  # H, B, V; L, history
    assert 2 <= steps_within_loop_limit(256, per_step, LAVAPIPE_LOOP_LIMIT) * per_step <= LAVAPIPE_LOOP_LIMIT // 2
    v5_step = PersistentPlan.of(dev, 2048, 1, 101).loop_iterations(3, 1)
    with pytest.raises(UsageError, match="CATCHAT_DECODE=fused"):
        steps_within_loop_limit(256, v5_step, LAVAPIPE_LOOP_LIMIT)


def test_persistent_step_reports_a_lost_barrier(dev, run_dir, monkeypatch):
    """A chunk whose grid barrier gave up (its stats word, as the GPU would count it) stops generation
    with DeviceLost naming the remedy, not with garbage tokens."""
    from catchat.errors import DeviceLost
    from catchat.vk import slots
    from catchat.vk.device import host_view

    monkeypatch.setenv("CATCHAT_DECODE", "persistent")
    gen = Generator.from_checkpoint(dev, ck.load_checkpoint(run_dir), streams=2, chunk=4)
    stats = gen._decoder_for(1).step.chunks[0].stats
    host_view(stats)[slots.ST_SYNC_TIMEOUTS] = 1
    dev.upload([stats])
    with pytest.raises(DeviceLost, match="lost its workgroups") as err:
        gen.generate(prompt_ids("BOB: "), 20, Sampling(), seed=1)
    assert "CATCHAT_DECODE=fused" in err.value.hint


def test_decode_step_must_be_named(dev, run_dir, monkeypatch):
    monkeypatch.setenv("CATCHAT_DECODE", "fast")
    gen = Generator.from_checkpoint(dev, ck.load_checkpoint(run_dir))
    with pytest.raises(UsageError, match="CATCHAT_DECODE='fast' is not a decode step"):
        gen.generate(prompt_ids("BOB: "), 5, Sampling(), seed=1)


def test_fused_step_text_does_not_depend_on_the_stream_tile(dev, run_dir, monkeypatch):
    """CATCHAT_DECODE_TILE (streams per subgroup in the fused layer and head kernels): 2, the default
    8 and 16 over 17 streams give the same tokens and the same last logits and state, bit for bit
    (each stream's sums are the same operations in the same order); a tile that is not a power of two
    up to 32 is refused."""
    from catchat.vk.kernels import decode

    ckpt = ck.load_checkpoint(run_dir)
    monkeypatch.setenv("CATCHAT_DECODE", "fused")
    got = []
    for tile in ("2", "", "16"):
        monkeypatch.setenv(decode.TILE_ENV, tile)
        gen = Generator.from_checkpoint(dev, ckpt, streams=17, chunk=4)
        assert gen._decoder_for(1).step.layer.shape.tile == (int(tile) if tile else decode.DECODE_TILE)
        outs = gen.generate(prompt_ids("ALICE: Where"), 24, Sampling(temperature=1.3), seed=7)
        got.append((outs, gen.logits.copy(), gen.prog.read("h0")[0].copy()))
    for outs, logits, h in got[1:]:
        assert outs == got[0][0]
        np.testing.assert_array_equal(logits, got[0][1])
        np.testing.assert_array_equal(h, got[0][2])
    monkeypatch.setenv(decode.TILE_ENV, "12")
    with pytest.raises(UsageError, match="CATCHAT_DECODE_TILE"):
        decode.max_stream_tile()


def test_decode_step_default_follows_streams_and_width():
    """Unset (or auto): at fp16 the tensor-core step from 4 streams where it runs (from 2 above H = 1024);
    then, where the device shows the persistent step's grid co-resident, a chunk in one dispatch up to 2
    streams (on float16 weights at fp16 where H >= 1024 and the device has float16); then the fused step on
    float16 weights at 1 stream where H >= 1024 and the device has float16; else the batched step from 32
    streams where H >= 1024 (v5 on the H200: 3x the fused step's speed at 64), the fused step elsewhere; a
    named step always wins, coop only where H is whole fragments."""
    from catchat.vk.program.decoder import decode_kind

    assert decode_kind(64, 2048, {}) == decode_kind(32, 1024, {"CATCHAT_DECODE": "auto"}) == "batched"
    assert decode_kind(31, 2048, {}) == decode_kind(64, 512, {}) == decode_kind(1, 2048, {}) == "fused"
    assert decode_kind(1, 512, {"CATCHAT_DECODE": "batched"}) == "batched"
    assert decode_kind(64, 2048, {"CATCHAT_DECODE": "fused"}) == "fused"
    # fp16: the tensor-core step from 4 streams where the device has tensor cores and H is whole fragments
    assert decode_kind(4, 512, {}, precision="fp16", tensor_cores=True) == "coop"
    assert decode_kind(3, 512, {}, precision="fp16", tensor_cores=True) == "fused"
    assert decode_kind(3, 1024, {}, precision="fp16", tensor_cores=True) == "fused"
    assert decode_kind(2, 2048, {}, precision="fp16", tensor_cores=True, float16=True) == "coop"
    assert decode_kind(64, 2048, {}, precision="fp16", tensor_cores=False) == "batched"
    assert decode_kind(64, 520, {}, precision="fp16", tensor_cores=True) == "fused"
    assert decode_kind(64, 2048, {}, precision="fp32", tensor_cores=True) == "batched"
    # the fused step on float16 weights: fp16, 1 stream, H >= 1024, a device with float16
    assert decode_kind(1, 2048, {}, precision="fp16", tensor_cores=True, float16=True) == "fused16"
    assert decode_kind(1, 1024, {}, precision="fp16", float16=True) == "fused16"
    assert decode_kind(1, 2048, {}, precision="fp16", tensor_cores=True) == "fused"  # no float16
    assert decode_kind(2, 2048, {}, precision="fp16", float16=True) == "fused"
    assert decode_kind(1, 512, {}, precision="fp16", float16=True) == "fused"
    assert decode_kind(1, 2048, {}, precision="fp32", float16=True) == "fused"
    assert decode_kind(1, 2048, {"CATCHAT_DECODE": "fused"}, precision="fp16", float16=True) == "fused"
    assert decode_kind(1, 512, {"CATCHAT_DECODE": "fused16"}) == "fused16"
    assert decode_kind(64, 512, {"CATCHAT_DECODE": "coop"}) == "coop"
    with pytest.raises(UsageError, match="multiple of 16"):
        decode_kind(64, 520, {"CATCHAT_DECODE": "coop"})
    # a chunk in one dispatch up to 2 streams where its grid is shown co-resident: on float16 weights at fp16
    # where H >= 1024 and the device has float16, else on the float32 weights
    assert decode_kind(1, 512, {}, grid=True) == decode_kind(1, 1000, {}, precision="fp16", grid=True) == "persistent"
    assert decode_kind(1, 512, {}, precision="fp16", tensor_cores=True, float16=True, grid=True) == "persistent"
    assert decode_kind(2, 512, {}, precision="fp16", tensor_cores=True, float16=True, grid=True) == "persistent"
    assert decode_kind(2, 512, {}, grid=True) == decode_kind(2, 2048, {}, grid=True) == "persistent"
    assert decode_kind(3, 512, {}, precision="fp16", float16=True, grid=True) == "fused"
    assert decode_kind(4, 512, {}, precision="fp16", tensor_cores=True, float16=True, grid=True) == "coop"
    assert decode_kind(1, 512, {}) == "fused"  # no grid shown co-resident (lavapipe, SM count unknown)
    assert decode_kind(1, 1024, {}, grid=True) == decode_kind(1, 2048, {}, precision="fp16", grid=True) == "persistent"
    assert decode_kind(1, 2048, {}, precision="fp16", float16=True, grid=True) == "persistent16"
    assert decode_kind(1, 1024, {}, precision="fp16", tensor_cores=True, float16=True, grid=True) == "persistent16"
    assert decode_kind(2, 2048, {}, precision="fp16", float16=True, grid=True) == "persistent16"  # no tensor cores
    assert decode_kind(2, 2048, {}, precision="fp16", tensor_cores=True, float16=True, grid=True) == "coop"
    assert decode_kind(1, 2048, {}, precision="fp16", float16=True) == "fused16"  # no grid
    assert decode_kind(1, 512, {"CATCHAT_DECODE": "fused"}, grid=True) == "fused"


# ------------------------------------------------------------------------------ catchat sample
def test_sample_flags_are_used(cli, run_dir):
    base = ("sample", run_dir, "--speaker", "BOB", "--prompt", "Asleep", "--length", "80", "--seed", "3")
    code, a, _ = cli(*base)
    assert code == 0 and a.startswith("BOB: Asleep") and len(a) > len("BOB: Asleep\n")
    assert cli(*base)[1] == a  # same seed, same text
    assert cli(*base[:-1], "4")[1] != a
    assert cli(*base, "--temperature", "0.3")[1] != a  # lesson 9: the flag changes the text
    assert cli(*base, "--temperature", "1.7")[1] != a
    greedy = cli(*base, "--greedy")[1]
    assert cli(*base, "--top-k", "1")[1] == greedy
    assert cli(*base[:-1], "9", "--top-k", "1", "--temperature", "2")[1] == greedy  # top-k 1 is greedy at any seed
    assert cli(*base, "--temperature", "0")[1] == greedy
    assert cli(*base, "--top-k", "5")[1] != a
    assert cli(*base, "--top-p", "0.5")[1] != a


def test_sample_talk_and_chat_take_a_precision(cli, run_dir, monkeypatch, tmp_path):
    """--precision fp16: the prompt's forward at fp16 and, with CATCHAT_DECODE=coop (what a GPU with
    tensor cores picks at fp16 from 4 streams), the tensor-core decode step; fp32 the default; anything
    else exit 2."""
    from catchat.inference import generate

    made = []
    real = generate.Generator.__init__

    def spy(self, *args, **kw):
        real(self, *args, **kw)
        made.append(self.prog.precision)

    monkeypatch.setattr(generate.Generator, "__init__", spy)
    monkeypatch.setenv("CATCHAT_DECODE", "coop")
    code, out, _ = cli("sample", run_dir, "--speaker", "BOB", "--length", "40", "--seed", "3", "--precision", "fp16")
    assert code == 0 and out.startswith("BOB: ") and made == ["fp16"]
    code, out, _ = cli("talk", run_dir, "--user", "ALICE", "--speaker", "BOB", "--length", "20", "--precision",
                       "fp16", stdin="Hello there.\n")
    assert code == 0 and out.strip() and made[-1] == "fp16"
    code, _, _ = cli("chat", run_dir, run_dir, "--turns", "2", "--length", "20", "--out", str(tmp_path / "c.jsonl"),
                     "--precision", "fp16", "--quiet")
    assert code == 0 and made[-2:] == ["fp16", "fp16"]
    code, _, err = cli("sample", run_dir, "--precision", "fp8")
    assert code == 2 and "--precision" in err and len(made) == 4


def test_sample_ngram_block_on_the_model(cli, run_dir):
    args = ("sample", run_dir, "--greedy", "--length", "150", "--prompt", "B",
            "--stop-at-turn")  # no <turn> shown as \n
    plain = cli(*args)[1].rstrip("\n")
    blocked = cli(*args, "--ngram-block", "4")[1].rstrip("\n")
    assert len(set(ngrams(plain, 4))) < len(ngrams(plain, 4))  # greedy loops...
    gen = blocked[1:]  # ...blocking stops it (the prompt "B" is not generated)
    assert len(gen) > 20 and len(set(ngrams(gen, 4))) == len(ngrams(gen, 4))


def test_sample_num_prints_every_sample(cli, run_dir):
    code, out, _ = cli("sample", run_dir, "--num", "3", "--length", "30", "--prompt", "ALICE:", "--seed", "2")
    assert code == 0
    heads = [line for line in out.splitlines() if line.startswith("--- sample ")]
    assert sorted(heads) == ["--- sample 1", "--- sample 2", "--- sample 3"]


@pytest.mark.parametrize("args, needle", [
    (("--temprature", "0.5"), "No such option"),
    (("--bogus",), "No such option"),
    (("--ngram-block", "1"), "ngram-block"),
    (("--top-p", "0"), "top-p"),
    (("--speaker", "A:B"), "contains ':'"),
    (("--speaker", ""), "empty"),
])
def test_sample_bad_flags_are_errors(cli, run_dir, args, needle):
    code, out, err = cli("sample", run_dir, *args)
    assert code == 2 and needle in err and out == ""


def test_sample_missing_checkpoint(cli, tmp_path):
    code, _, err = cli("sample", tmp_path / "nope")
    assert code == 2 and "no checkpoint at" in err and "fix:" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ the benchmark tool
def test_bench_generate_runs(dev, tmp_path, capsys, monkeypatch):
    mod = load_tool("bench_generate")
    monkeypatch.setattr(mod, "open_device", lambda device=None: dev)
    out = tmp_path / "r.json"
    mod.main([str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=16", "--set", "model.layers=1",
              "--batches", "1,3", "--steps", "4", "--warmup", "1", "--compare-torch", "--json", str(out)])
    res = json.loads(out.read_text())
    assert [r["batch"] for r in res["catchat"]] == [1, 3]
    assert all(r["chars_per_s"] > 0 and sum(r["device_us"].values()) > 0 for r in res["catchat"])
    assert "chars/s" in capsys.readouterr().out
    assert "torch" in res or "torch_skipped" in res


def test_coop_step_needs_float16(dev, run_dir, monkeypatch):
    """CATCHAT_DECODE=coop on a device without float16 arithmetic and 16-bit storage: a usage error
    that says so, not a traceback from the kernel."""
    monkeypatch.setenv("CATCHAT_DECODE", "coop")
    monkeypatch.setattr(type(dev), "runs_float16", property(lambda self: False))
    gen = Generator.from_checkpoint(dev, ck.load_checkpoint(run_dir))
    with pytest.raises(UsageError, match="float16 arithmetic"):
        gen.generate(prompt_ids("BOB: "), 5, Sampling(), seed=1)


def test_persistent_grid_is_balanced_and_only_where_shown_resident():
    """The chunk's dispatch takes at most one workgroup per SM, the fewest that give its largest stage
    as many workgroups each, and only where all are shown co-resident (else one, which needs no other)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from catchat.vk.kernels.decode_persistent import PersistentPlan, persistent_grid, persistent_threads
    from catchat.vk.probe import DeviceInfo

    h200 = DeviceInfo(index=0, name="NVIDIA H200", type="DISCRETE_GPU", vendor="NVIDIA", driver="580",
                      api_version="1.4", max_storage_buffer_bytes=1 << 32, max_shared_memory_bytes=49152,
                      max_push_constant_bytes=256, max_workgroup_invocations=1024, subgroup_size=32,
                      compute_units=132)
    dev = SimpleNamespace(info=h200)
    assert persistent_threads(dev, 101) == 128  # a token a thread, 4 subgroups: v3's 512 units on 128 workgroups
    assert persistent_threads(dev, 40) == 64  # the choice's reductions want two subgroups
    # a unit a subgroup over one workgroup per SM: v3 4 subgroups, v5 16 (its layers bound by their loads)
    assert [persistent_threads(dev, 101, H) for H in (512, 1024, 2048, 8192)] == [128, 256, 512, 1024]
    v3, v5 = PersistentPlan.of(dev, 512, 1, 101), PersistentPlan.of(dev, 2048, 1, 101)
    assert (v3.threads, v3.shape.row_wgs, v3.grid) == (128, 128, 128)
    assert (v5.threads, v5.shape.row_wgs, v5.grid, v5.kp) == (512, 128, 128, 32)
    assert [persistent_grid(dev, 128, 2336, n) for n in (128, 512, 200, 133, 1)] == [128, 128, 100, 67, 1]
    assert persistent_grid(dev, 128, 40_000, 512) == 128  # one per SM fits 40 KB of shared memory
    assert persistent_grid(dev, 128, 60_000, 512) == 1  # more than an SM is shown to hold: not even one a SM
    assert persistent_grid(SimpleNamespace(info=replace(h200, type="CPU")), 128, 2336, 512) == 1
    assert persistent_grid(SimpleNamespace(info=replace(h200, compute_units=0)), 128, 2336, 512) == 1
