#!/usr/bin/env python3
"""Generation speed of catchat beside PyTorch: characters per second and time to the first character.

    python tools/bench_generate.py configs/catchat-v3.toml [--batches 1,64] [--steps 200] [--chunk N]
                                   [--decode fused,batched,coop] [--precision fp16]
                                   [--compare-torch [--graph-chunk 64]] [--json out.json]

For each batch size B (independent streams generated at once) every variant generates --steps
characters per stream from the prompt <bos> alone (so "state ready" is the zero state: nothing to
prefill, and the first character costs one forward step, its sampling and getting it to the host),
sampling at temperature 0.8. One table per batch size:
  chars/s         characters that reached the host / the whole generation's time
  step ms         that time / characters per stream
  first char ms   from the call that starts generation until the first generated character is
                  on the host (how long a streaming user waits before text appears)
  vs graph        the row's chars/s and first char time over the CUDA graph's (catchat's row is
                  catchat / graph; catchat's targets are stated against that baseline)
Each figure is the median of --repeats timed runs, after --warmup characters.

catchat: `Generator(dev, layout, params, streams=B[, chunk=--chunk]).generate(<bos>, steps,
Sampling(temperature=0.8), seed=0, stop_at=(), on_tokens=...)` timed end to end through the
public API alone, whatever the Generator does underneath; the first character is the first
call of on_tokens. --chunk (characters per submit) is passed only when given: by default the
Generator chooses. --decode: a catchat row per decode step (CATCHAT_DECODE set around each).
--precision fp16: the Generator's precision (its prompt forward and decode step on float16 operands,
the tensor-core step from 8 streams where the GPU has tensor cores), and PyTorch's model in float16
(`.half()`: cuDNN's GRU and the GEMMs on float16), so each ratio compares like with like.
Weights are random (init_params) but for a few rows that make <eos>
unchoosable (`bench_params`): <eos> always ends a stream, the speed does not depend on the
weights' values, and so every stream generates all `steps` characters (chars/s counts the
characters actually produced; `short_streams` in --json says if any stream stopped early).

With --compare-torch (torch importable; --torch-device, default cuda) the same architecture in
PyTorch, default initialisation, eval mode and no_grad, TF32 off: nn.Embedding scaled by sqrt(H),
per layer an nn.GRU step + residual + nn.RMSNorm, a linear head without bias. Rows:
  torch eager              softmax + torch.multinomial on the device, tokens left on the device
                           (the first alone is copied, to time it): the fastest eager goes
  torch eager + host copy  the same with the tokens copied to the host every step (streaming)
  torch CUDA graph         CUDA only: one graph of --graph-chunk (64) decode steps, each sampling
                           by Gumbel-max on the device (argmax(logits/T - log(-log(U))), U from
                           torch.rand inside the graph) into a static [chunk, B] token buffer and
                           feeding it to the next step; hidden states carried between replays in
                           static tensors; after every replay the [chunk, B] tokens are copied to
                           the host. Steps are rounded up to whole chunks; the first character
                           arrives with the first chunk.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import config as cfgmod  # noqa: E402
from catchat import environment  # noqa: E402
from catchat.analysis.torch_twin import torch_model  # noqa: E402
from catchat.data import vocab  # noqa: E402
from catchat.errors import UsageError  # noqa: E402
from catchat.inference.generate import Generator, Sampling  # noqa: E402
from catchat.model import ParamLayout, head_name, init_params  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.program.decoder import DECODE_ENV, DECODE_KINDS, decode_step, device_decode_kind  # noqa: E402

TEMPERATURE = 0.8
SEED = 0
GRAPH_CHUNK = 64  # decode steps per CUDA graph replay (the baseline's)
PROMPT = np.array([vocab.BOS], np.uint32)
EOS_LOGIT_WEIGHT = -1000.0  # bench_params: head[<eos>, 0]; x_L[0] > 0, so <eos>'s logit is hugely negative
ROWS = (("catchat", "catchat"), ("eager", "torch eager"), ("eager_host_copy", "torch eager + host copy"),
        ("graph", "torch CUDA graph"))


def _median(xs) -> float:
    return float(statistics.median(xs))


# ---------------------------------------------------------------------------------------------
# catchat
# ---------------------------------------------------------------------------------------------

def bench_params(spec) -> dict[str, np.ndarray]:
    """init_params(spec, 0) with <eos> made unchoosable, so no stream stops early.

    Coordinate 0 of the residual stream is kept positive through every layer: each embedding
    row has it at 10 (after the sqrt(H) scale); each GRU's candidate for unit 0 is tanh(20) ~ 1
    whatever its inputs (that row of weight_ih and weight_hh zeroed, b_in 20, b_hn 0), so h[0]
    (the layer's output) stays in [0, 1) from a zero state and residual + RMSNorm (gains 1) keep
    x[0] > 0. The head row of <eos> is EOS_LOGIT_WEIGHT at coordinate 0 and 0 elsewhere: its logit
    is hundreds below any other (those are at most sqrt(H) in size). Speed does not depend on the
    values; the other weights stay random."""
    p = {k: v.copy() for k, v in init_params(spec, 0).items()}
    H = spec.hidden
    p["embedding.weight"][:, 0] = 10.0 / math.sqrt(H)
    n = 2 * H  # first row of the candidate gate (PyTorch's order r, z, n)
    for l in range(spec.layers):
        p[f"layers.{l}.gru.weight_ih"][n] = 0.0
        p[f"layers.{l}.gru.weight_hh"][n] = 0.0
        p[f"layers.{l}.gru.bias_ih"][n] = 20.0
        p[f"layers.{l}.gru.bias_hh"][n] = 0.0
    head = p[head_name(spec)]  # tied: <eos> is never fed
    head[vocab.EOS] = 0.0
    head[vocab.EOS, 0] = EOS_LOGIT_WEIGHT
    return p


def bench_talk_reply(spec, dev, repeats: int = 3) -> dict:
    """A `talk` turn: the user's line (80 characters) and the model's prefix fed, then the reply
    sampled (the first 64 characters of it); the time to its first character is what a user waits."""
    from catchat.inference.talk import Dialogue

    layout = ParamLayout(spec)
    gen = Generator(dev, layout, layout.flatten(bench_params(spec), np.float32))
    dialogue = Dialogue(gen, 800)
    waits = []
    for i in range(repeats + 1):  # the first turn builds the decoder: not counted
        dialogue.add("YOU", "Tell me, good friend, what news from the court, and who rides with the king today?")
        first: list[float] = []
        t0 = time.perf_counter()
        dialogue.reply("CAT", 64, Sampling(temperature=TEMPERATURE), seed=i,
                       on_token=lambda _t, first=first: first or first.append(time.perf_counter()))
        if i and first:
            waits.append(first[0] - t0)
    return dict(first_char_ms=_median(waits) * 1e3 if waits else float("nan"), turns=len(waits))


def bench_catchat(spec, dev, B: int, steps: int, warmup: int, chunk: int | None = None, repeats: int = 3,
                  precision: str = "fp32") -> dict:
    """catchat's generation through the public Generator API: `generate` from <bos>, end to end."""
    layout = ParamLayout(spec)
    extra = {} if chunk is None else {"chunk": chunk}
    gen = Generator(dev, layout, layout.flatten(bench_params(spec), np.float32), streams=B, precision=precision,
                    **extra)
    sampling = Sampling(temperature=TEMPERATURE)

    def run(n: int) -> tuple[float, float, int, int]:
        first: list[float] = []

        def on_tokens(tokens) -> None:
            if not first:
                first.append(time.perf_counter())

        t0 = time.perf_counter()
        outs = gen.generate(PROMPT, n, sampling, seed=SEED, stop_at=(), on_tokens=on_tokens)
        total = time.perf_counter() - t0
        if not first:
            raise RuntimeError("Generator.generate never called on_tokens")
        return total, first[0] - t0, sum(len(o) for o in outs), sum(len(o) < n for o in outs)

    if warmup:
        run(warmup)
    runs = [run(steps) for _ in range(repeats)]
    total = _median(r[0] for r in runs)
    chars = min(r[2] for r in runs)
    gen.reset()
    gen.feed(PROMPT)
    profile = gen.profile()  # device microseconds per decode step, by kernel
    return dict(batch=B, steps=steps, chunk=chunk, generator_chunk=gen.chunk, chars=chars,
                short_streams=max(r[3] for r in runs), chars_per_s=chars / total, step_ms=total / steps * 1e3,
                first_char_ms=_median(r[1] for r in runs) * 1e3, device_us=profile,
                layer_kernel=gen.layer_shape())


# ---------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------

def _torch_model(spec, dev, half: bool = False):
    """The architecture in PyTorch (default init, seed 0), eval mode, TF32 off, float16 weights with
    `half`; `.step(tok, hs)` is one decode step: tok [B] long, hs L x [1, B, H] -> logits [B, V], new hs."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = torch_model(spec, dev).eval()
    return model.half() if half else model


def _zero_states(model, spec, B: int, dev) -> list:
    """L zero hidden states [1, B, H] in the model's dtype."""
    import torch

    dtype = next(model.parameters()).dtype
    return [torch.zeros(1, B, spec.hidden, device=dev, dtype=dtype) for _ in range(spec.layers)]


def bench_torch(spec, B: int, steps: int, warmup: int, device: str, repeats: int = 3, half: bool = False) -> dict:
    """PyTorch eager: softmax + multinomial on the device, with and without a host copy per step."""
    import torch

    dev = torch.device(device)
    model = _torch_model(spec, dev, half)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def loop(n: int, host_copy: bool) -> tuple[float, float]:
        """(whole time, time until the first token is on the host) for n steps from <bos>."""
        with torch.no_grad():
            tok = torch.full((B,), vocab.BOS, dtype=torch.long, device=dev)
            hs = _zero_states(model, spec, B, dev)
            sync()
            t0 = time.perf_counter()
            first = None
            for i in range(n):
                logits, hs = model.step(tok, hs)
                probs = torch.softmax(logits.float() / TEMPERATURE, dim=-1)
                tok = torch.multinomial(probs, 1)[:, 0]
                if host_copy or i == 0:
                    tok.cpu()
                    if i == 0:
                        first = time.perf_counter()
            sync()
            return time.perf_counter() - t0, first - t0

    if warmup:
        loop(warmup, False)
    out = dict(batch=B, steps=steps)
    for key, host_copy in (("", False), ("_host_copy", True)):
        runs = [loop(steps, host_copy) for _ in range(repeats)]
        total = _median(r[0] for r in runs)
        out |= {f"chars_per_s{key}": B * steps / total, f"step_ms{key}": total / steps * 1e3,
                f"first_char_ms{key}": _median(r[1] for r in runs) * 1e3}
    return out


class TorchGraphDecoder:
    """Decoding in PyTorch as one CUDA graph of `chunk` steps: the model's step, Gumbel-max
    sampling on the device and the sampled token fed to the next step, captured once and replayed;
    everything it reads and writes across replays lives in static tensors."""

    def __init__(self, model, spec, B: int, device: str, chunk: int = GRAPH_CHUNK,
                 temperature: float = TEMPERATURE):
        import torch

        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device!r}")
        self.dev, self.chunk = dev, chunk
        V = spec.vocab_size
        # static tensors: the graph reads and writes these same addresses at every replay
        self.tok_in = torch.full((B,), vocab.BOS, dtype=torch.long, device=dev)  # the next step's input
        self.hs = _zero_states(model, spec, B, dev)  # hidden states between replays
        self.out = torch.empty(chunk, B, dtype=torch.long, device=dev)  # the chunk's sampled tokens
        self.host = torch.empty(chunk, B, dtype=torch.long, pin_memory=True)

        def decode_chunk():
            tok, h = self.tok_in, self.hs
            for i in range(chunk):
                logits, h = model.step(tok, h)
                u = torch.rand(B, V, device=dev)  # default CUDA generator: graph-safe, fresh numbers each replay
                tok = torch.argmax(logits.float() / temperature - torch.log(-torch.log(u)), dim=-1)
                self.out[i].copy_(tok)
            self.tok_in.copy_(tok)
            for s, n in zip(self.hs, h):
                s.copy_(n)

        with torch.no_grad():
            side = torch.cuda.Stream(dev)  # warm up on a side stream before capture (the PyTorch docs' recipe)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(3):
                    decode_chunk()
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                decode_chunk()
        self.reset()

    def reset(self) -> None:
        """Back to <bos> and the zero state (queued on the current stream)."""
        self.tok_in.fill_(vocab.BOS)
        for h in self.hs:
            h.zero_()

    def next_chunk(self):
        """Replay once and copy the chunk's tokens to the host: [chunk, B] (a pinned CPU tensor,
        overwritten by the next call); they are there when this returns."""
        self.graph.replay()
        self.host.copy_(self.out)  # blocking copy
        return self.host


def bench_torch_graph(spec, B: int, steps: int, warmup: int, device: str, chunk: int = GRAPH_CHUNK,
                      repeats: int = 3, half: bool = False) -> dict:
    """PyTorch with one CUDA graph of `chunk` decode steps (Gumbel-max sampling on the device),
    replayed back to back with the chunk's tokens copied to the host after every replay."""
    import torch

    dec = TorchGraphDecoder(_torch_model(spec, torch.device(device), half), spec, B, device, chunk)
    replays = -(-steps // chunk)

    def run(n_replays: int) -> tuple[float, float]:
        """(whole time, time until the first chunk's tokens are on the host) from <bos>."""
        dec.reset()
        torch.cuda.synchronize(dec.dev)
        t0 = time.perf_counter()
        first = None
        for _ in range(n_replays):
            dec.next_chunk()
            if first is None:
                first = time.perf_counter()
        return time.perf_counter() - t0, first - t0

    run(max(1, -(-warmup // chunk)))
    runs = [run(replays) for _ in range(repeats)]
    total = _median(r[0] for r in runs)
    n = replays * chunk
    return dict(batch=B, steps=n, chunk=chunk, chars_per_s=B * n / total, step_ms=total / n * 1e3,
                first_char_ms=_median(r[1] for r in runs) * 1e3)


def _torch_device(want: str) -> tuple[str | None, str]:
    """(device, '') when torch can run there, else (None, why not)."""
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not importable ({exc})"
    if want.startswith("cuda") and not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    name = torch.cuda.get_device_name(torch.device(want)) if want.startswith("cuda") else "cpu"
    return want, f"torch {torch.__version__} on {name}"


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def table_rows(cs: list[dict], eager: dict | None, graph: dict | None, torch_tag: str = "") -> list[dict]:
    """The rows of one batch size's table: name, chars/s, step ms, first char ms and, with the
    CUDA graph measured, each row's chars/s and first-char time over the graph's. cs: catchat's
    results at this batch, one per decode step measured ("catchat (fused)", ... when several);
    torch_tag follows the torch rows' names (" fp16")."""
    rows = [dict(variant="catchat" if len(cs) == 1 else f"catchat ({c['decode']})", chars_per_s=c["chars_per_s"],
                 step_ms=c["step_ms"], first_char_ms=c["first_char_ms"]) for c in cs]
    if eager is not None:
        for key, name in (("", "torch eager"), ("_host_copy", "torch eager + host copy")):
            rows.append(dict(variant=name + torch_tag, chars_per_s=eager[f"chars_per_s{key}"],
                             step_ms=eager[f"step_ms{key}"],
                             first_char_ms=eager[f"first_char_ms{key}"]))
    if graph is not None:
        rows.append(dict(variant=f"torch CUDA graph ({graph['chunk']}/replay){torch_tag}",
                         chars_per_s=graph["chars_per_s"], step_ms=graph["step_ms"],
                         first_char_ms=graph["first_char_ms"]))
        for r in rows:
            r["chars_per_s_vs_graph"] = r["chars_per_s"] / graph["chars_per_s"]
            r["first_char_vs_graph"] = r["first_char_ms"] / graph["first_char_ms"]
    return rows


def format_table(B: int, steps: int, rows: list[dict]) -> str:
    ratios = "chars_per_s_vs_graph" in rows[0]
    head = f"{f'batch {B}, {steps} per stream':<32}{'chars/s':>12}{'step ms':>10}{'first char ms':>15}"
    if ratios:
        head += f"{'chars/s vs graph':>18}{'first char vs graph':>21}"
    lines = [head]
    for r in rows:
        line = f"{r['variant']:<32}{r['chars_per_s']:>12,.0f}{r['step_ms']:>10.3f}{r['first_char_ms']:>15.3f}"
        if ratios:
            line += f"{r['chars_per_s_vs_graph']:>17.2f}x{r['first_char_vs_graph']:>20.2f}x"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--batches", default="1,64", help="comma-separated stream counts (default 1,64)")
    ap.add_argument("--steps", type=int, default=200, help="characters generated per stream and timing")
    ap.add_argument("--warmup", type=int, default=10, help="characters generated before the timings")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per figure; the median is reported")
    ap.add_argument("--chunk", type=int, default=None,
                    help="catchat's characters per submit (Generator chunk=; default: the Generator chooses)")
    ap.add_argument("--device", default=None, help="Vulkan device (index or name)")
    ap.add_argument("--compare-torch", action="store_true",
                    help="also time PyTorch: eager, eager with host copies, and (CUDA) the CUDA graph")
    ap.add_argument("--torch-device", default="cuda", help="where torch runs (default cuda)")
    ap.add_argument("--graph-chunk", type=int, default=GRAPH_CHUNK,
                    help=f"decode steps per CUDA graph replay (default {GRAPH_CHUNK})")
    ap.add_argument("--decode", default=None,
                    help=f"comma-separated decode steps to time, each a catchat row: {', '.join(DECODE_KINDS)} "
                         f"(catchat/vk/program/decoder.py; default: ${DECODE_ENV}'s, else the Generator's "
                         "choice at each batch)")
    ap.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                    help="fp16: catchat's Generator at fp16 (the tensor-core decode step where it runs) and "
                         "PyTorch's model in float16 (default fp32: both float32, TF32 off)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.decode.split(",") if k.strip()] if args.decode else None
    if kinds is not None and (not kinds or any(k not in DECODE_KINDS for k in kinds)):
        ap.error(f"--decode takes a comma-separated list of {', '.join(DECODE_KINDS)}, got {args.decode!r}")
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1 or args.steps < 1 or args.warmup < 0 or args.repeats < 1:
        ap.error("--batches, --steps and --repeats must be >= 1 and --warmup >= 0")
    if args.graph_chunk < 1 or (args.chunk is not None and args.chunk < 1):
        ap.error("--chunk and --graph-chunk must be >= 1")
    cfg = cfgmod.load(args.config, args.overrides)
    spec = cfgmod.model_spec(cfg)
    dev = open_device(args.device)
    print(f"config {args.config}: H={spec.hidden} L={spec.layers} V={spec.vocab_size}; {args.steps} characters "
          f"per stream from <bos>, temperature {TEMPERATURE}; median of {args.repeats}; Vulkan device {dev.info.name}")
    res: dict = {"config": str(args.config), "hidden": spec.hidden, "layers": spec.layers,
                 "vocab_size": spec.vocab_size, "vulkan_device": dev.info.name, "steps": args.steps,
                 "warmup": args.warmup, "repeats": args.repeats, "temperature": TEMPERATURE, "chunk": args.chunk,
                 "precision": args.precision, "env": environment.settings(), "catchat": []}
    half = args.precision == "fp16"
    for B in batches:
        for kind in kinds or [device_decode_kind(dev, B, spec.hidden, spec.vocab_size, args.precision)]:
            try:
                with decode_step(kind):
                    c = bench_catchat(spec, dev, B, args.steps, args.warmup, args.chunk, args.repeats, args.precision)
            except UsageError as exc:  # e.g. a --chunk the Generator refuses
                ap.error(str(exc))
            res["catchat"].append({**c, "decode": kind})
    res["talk_reply"] = talk = bench_talk_reply(spec, dev, args.repeats)
    print(f"talk: first character of a reply after an 80-character user line: {talk['first_char_ms']:.2f} ms "
          f"(median of {talk['turns']} turns)")
    eager: list = [None] * len(batches)
    graph: list = [None] * len(batches)
    if args.compare_torch:
        where, what = _torch_device(args.torch_device)
        if where is None:
            res["torch_skipped"] = what
            print(f"torch comparison skipped: {what}")
        else:
            res["torch_device"] = what
            res["torch"] = eager = [bench_torch(spec, B, args.steps, args.warmup, where, args.repeats, half)
                                    for B in batches]
            if where.startswith("cuda"):
                res["torch_graph"] = graph = [
                    bench_torch_graph(spec, B, args.steps, args.warmup, where, args.graph_chunk, args.repeats, half)
                    for B in batches]
            else:
                res["torch_graph_skipped"] = f"CUDA graphs need a CUDA device (torch runs on {where})"
                print(f"torch CUDA graph skipped: {res['torch_graph_skipped']}")
            print(f"torch: {what}")
    res["tables"] = []
    for B, e, g in zip(batches, eager, graph):
        cs = [c for c in res["catchat"] if c["batch"] == B]
        rows = table_rows(cs, e, g, " fp16" if half else "")
        res["tables"].append({"batch": B, "rows": rows})
        print()
        print(format_table(B, args.steps, rows))
        for c in cs:
            size = c["generator_chunk"] if c["generator_chunk"] is not None else c["chunk"]
            chunk = "the Generator's default" if c["chunk"] is None else "--chunk"
            chunk = f"{size} ({chunk})" if size is not None else chunk
            kernels = ", ".join(f"{k} {v:.1f}" for k, v in c["device_us"].items())
            note = (f"catchat ({c['decode']} step): {c['chars']:,} characters in {B} streams, chunk {chunk}; device "
                    f"us per step: {kernels} (sum {sum(c['device_us'].values()):.1f})")
            if c["short_streams"]:
                note += f"; {c['short_streams']} streams stopped early"
            if g is not None and g["steps"] != args.steps:
                note += f"; the graph ran {g['steps']} steps (whole chunks)"
            print(note)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
