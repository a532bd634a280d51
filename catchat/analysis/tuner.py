"""Tile tuning for this GPU (`catchat bench --tune`): for every shape a program of the config asks
tile pickers about (catchat/vk/tune.py's `recording`), time each candidate the tables list that fits
this device (GEMM tiles; the tensor-core GEMM's grid where train.precision is "fp16" on a GPU with
cooperative matrices, and its float32 mode's from float16 splits for the large GEMMs at "fp32" there;
sweep tiles: register-resident, persistent and per-step), check it computes what the tables' choice
does, and cache the fastest per device, driver and shape; the pickers use it from then on.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field

import numpy as np

from catchat import config as cfgmod
from catchat.analysis.timing import NoProgress, timed_sequence
from catchat.model import ParamLayout
from catchat.vk import slots
from catchat.vk import tune as tunecache
from catchat.vk.device import host_view
from catchat.vk.kernels import gemm, gru, half_tensor, run_ops


@dataclass
class TuneRow:
    """One shape's measurement: the candidates with seconds (None: failed or computed something
    else), the tables' choice and the winner (None: nothing to choose from)."""

    kind: str
    key: str
    table: object
    candidates: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    winner: object = None

    def form(self, tiles) -> list | None:
        """`tiles` as the cache holds them (`cache_form`)."""
        return None if tiles is None else cache_form(self.kind, tiles)

    def fields(self, tiles) -> list | None:
        """`tiles`' fields, for printing and JSON: a CoopTiles' `dataclasses.astuple`, else the numbers."""
        return None if tiles is None else list(astuple(tiles) if self.kind in COOP_KINDS else tiles)

    def micros(self, tiles) -> float | None:
        """Microseconds measured for `tiles` (None: not measured, failed, or no such candidate)."""
        for c, s in zip(self.candidates, self.seconds):
            if tiles is not None and c == tiles and s is not None:
                return s * 1e6
        return None


COOP_KINDS = ("coop", "split")  # the tensor-core GEMM's tiles (CoopTiles): float16 operands, float32 from splits
GEMM_KINDS = ("gemm",) + COOP_KINDS


def cache_form(kind: str, tiles) -> list:
    """A candidate as catchat/vk/tune.py stores it: GEMM tiles' five numbers, a CoopTiles' fields
    (`dataclasses.astuple`: the numbers and its extension), a sweep's `gru.to_cache`."""
    if kind in COOP_KINDS:
        return list(astuple(tiles))
    return [int(v) for v in tiles] if kind == "gemm" else gru.to_cache(tiles)


def tune_shapes(cfg, dev) -> dict:
    """(kind, key) -> shape for every tile choice the config's training and evaluation programs make
    on dev at the config's train.precision (built once under catchat/vk/tune.py's `recording`, with
    the per-timestep rows of scheduled sampling and free-running evaluation, then dropped): with
    "fp16" on a GPU with cooperative matrices every GEMM asks `gemm.pick_coop_tiles` (kind "coop"),
    with "fp32" there the large ones `gemm.pick_split_tiles` (kind "split", `gemm.split_gemm`)."""
    from catchat.vk.program import Program
    from catchat.vk.program.kernelsets import build_stepwise

    layout = ParamLayout(cfgmod.model_spec(cfg))
    with tunecache.recording() as asked:
        prog = Program(dev, layout, cfg.data.window, cfg.data.batch_lanes, optimizer=cfg.train.optimizer,
                       precision=cfg.train.precision)
        build_stepwise(dev, layout, prog.buffers, prog.geometry, prog.precision)  # kernels made on first use
    return dict(asked)


def candidates_of(dev, kind: str, shape: dict) -> tuple[object, list]:
    """(the tables' choice, every candidate the tables list that fits dev) for one shape; for "coop"
    the program's choice without the cache and the tensor-core grid (`gemm.coop_candidates`), for
    "split" the split GEMM's rule and SPLIT_GRID (`gemm.split_candidates`)."""
    if kind == "gemm":
        return gemm.table_gemm_tiles(dev, shape["M"], shape["N"], shape["split_k"]), gemm.gemm_candidates(dev)
    if kind == "coop":
        trans = (shape["trans_a"], shape["trans_b"])
        return (gemm.pick_coop_tiles(dev, shape["M"], shape["N"], shape["split_k"], trans, coopmat2=False),
                gemm.coop_candidates(dev, trans))
    if kind == "split":
        trans = (shape["trans_a"], shape["trans_b"])
        return (gemm.split_tiles(dev, shape["M"], shape["N"], shape["split_k"], trans),
                gemm.split_candidates(dev, trans))
    args = (dev, shape["B"], shape["H"], shape["backward"], shape["resident"])
    return gru.table_tiles(*args), gru.sweep_candidates(*args)


class SweepCase:
    """Buffers of one B x H recurrent sweep of T steps on random weights (no resets), in the program's
    layout (o holds the state sequence, dGh goes over save), and its sweeps over `persistent`
    workgroups; `half`: W_hh from a float16 copy (HALF_W, `w16`). The tuner's and tools/bench_gru.py's."""

    def __init__(self, dev, B: int, H: int, T: int, persistent: int):
        rng = np.random.default_rng(0)
        self.dev, self.B, self.H, self.T, self.persistent = dev, B, H, T, persistent
        t = dev.tensor
        w = (rng.standard_normal(3 * H * H + 3 * H) / np.sqrt(H)).astype(np.float32)
        self.params, self._w_hh, self._w16 = t(w), w[:3 * H * H], None
        self.gi = t(rng.standard_normal(T * B * 3 * H).astype(np.float32))
        self.do = t((0.01 * rng.standard_normal(T * B * H)).astype(np.float32))
        self.h0, self.hT, self.dh0 = t(B * H), t(B * H), t(B * H)
        self.resets = t(np.zeros(T * B, np.uint32), np.uint32)
        self.o = t((T + 1) * B * H)  # rows [0, T) hprev, [1, T+1) the outputs (catchat/vk/program/plan.py)
        self.save = t(T * B * 4 * H)
        self.dgi = t(T * B * 3 * H)
        self.hyper = t(np.zeros(slots.HP_WORDS, np.uint32), np.uint32)
        self.stats = t(np.zeros(slots.ST_WORDS, np.uint32), np.uint32)
        run_ops(dev, [self.params, self.gi, self.do, self.h0, self.resets, self.hyper, self.stats], [], [])

    @property
    def w16(self):
        """W_hh as float16 for HALF_W, made on first use (the tuner never asks: 3H^2 halves saved)."""
        if self._w16 is None:
            self._w16 = half_tensor(self.dev, self._w_hh)
            run_ops(self.dev, [self._w16], [], [])
        return self._w16

    def forward(self, tiles, half: bool = False):
        return gru.GruForward(self.dev, self.gi, self.params, self.h0, self.resets, self.o, self.o, self.save,
                              self.hT, T=self.T, B=self.B, H=self.H, w_off=0, b_off=3 * self.H * self.H,
                              o_off=gru.state_rows(self.B, self.H), tiles=tiles, persistent=self.persistent,
                              w_half=self.w16 if half else None)

    def backward(self, tiles, half: bool = False):
        return gru.GruBackward(self.dev, self.do, self.save, self.o, self.resets, self.params, self.hyper,
                               self.dgi, None, self.dh0, self.stats, T=self.T, B=self.B, H=self.H, w_off=0,
                               tiles=tiles, persistent=self.persistent, w_half=self.w16 if half else None)


class Measurer:
    """Times tile candidates on random operands, one buffer set per shape; `__call__(kind, shape,
    tiles)` gives seconds per run (a GEMM recorded `gemm_repeat` times in one sequence, a sweep of
    `steps` steps), or None when the candidate failed or computed something other than the first
    candidate of its shape (the tables' choice). `precision`: the program's; glsl/gemm.comp's tiles
    ("gemm") are timed with its loads ("fp16": rounded to float16), the tensor-core GEMM's ("coop")
    always take float16 operands and its split tiles ("split") float32 ones."""

    def __init__(self, dev, reps: int = 5, steps: int = 32, gemm_repeat: int = 8, precision: str = "fp32"):
        self.dev, self.reps, self.steps, self.gemm_repeat = dev, reps, steps, gemm_repeat
        self.precision = precision
        self.rng = np.random.default_rng(0)
        self.shape_key, self.bufs, self.reference = None, None, None

    def _tensor(self, n: int):
        return self.dev.tensor(self.rng.standard_normal(max(1, n)).astype(np.float32))

    def _setup(self, kind: str, shape: dict):
        key = (kind, tuple(sorted(shape.items())))
        if key == self.shape_key:
            return
        self.shape_key, self.reference, dev = key, None, self.dev
        if kind in GEMM_KINDS:
            M, N, K = shape["M"], shape["N"], shape["K"]
            self.bufs = dict(a=self._tensor(M * K), b=self._tensor(K * N), c=self._tensor(M * N),
                             work=dev.tensor(max(1, shape["split_k"] * M * N), kind="storage"))
            dev.upload([self.bufs[n] for n in "abc"])
            return
        case = SweepCase(dev, shape["B"], shape["H"], self.steps, shape["resident"])
        self.bufs = dict(case=case, stats=case.stats)
        if shape["backward"]:  # the backward reads the save and state sequence of a forward sweep
            run_ops(dev, [], case.forward(None).sweep_ops(), [case.o])

    def _kernel(self, kind: str, shape: dict, tiles):
        """(ops to time, the output tensor)."""
        b = self.bufs
        if kind in GEMM_KINDS:
            M, N, K, ta, tb = shape["M"], shape["N"], shape["K"], shape["trans_a"], shape["trans_b"]
            how = {"coop": dict(precision="fp16", coopmat=True, coopmat2=False),
                   "split": dict(precision="fp32", split=True)}.get(kind, dict(precision=self.precision, coopmat=False))
            k = gemm.Gemm(self.dev, (b["a"], 0, M if ta else K), (b["b"], 0, K if tb else N), (b["c"], 0, N),
                          M, N, K, trans_a=ta, trans_b=tb, split_k=shape["split_k"], tiles=tiles, workspace=b["work"],
                          **how)
            return k.ops(), b["c"]
        case = b["case"]
        if not shape["backward"]:
            return case.forward(tiles).sweep_ops(), case.o
        return case.backward(tiles).sweep_ops(), case.dgi

    def __call__(self, kind: str, shape: dict, tiles) -> float | None:
        self._setup(kind, shape)
        try:
            ops, out = self._kernel(kind, shape, tiles)
        except (ValueError, RuntimeError):
            return None
        host_view(out)[:] = np.nan  # a kernel that writes nothing cannot pass as a match
        self.dev.upload([out])
        n = self.gemm_repeat if kind in GEMM_KINDS else 1  # a GEMM recorded n times: the submit's cost spread
        sec = timed_sequence(self.dev, ops * n, self.reps) / n
        stats = self.bufs.get("stats")
        got, *st = run_ops(self.dev, [], [], [out] + ([stats] if stats is not None else []))  # one download
        if st and st[0][slots.ST_SYNC_TIMEOUTS]:
            host_view(stats)[:] = 0
            self.dev.upload([stats])
            return None  # its grid barrier gave up: not all its workgroups were resident
        if self.reference is None:
            self.reference = got
        scale = max(float(np.nanmax(np.abs(self.reference))), 1e-30)
        err = float(np.abs(got - self.reference).max()) / scale
        return sec if np.isfinite(err) and err <= 1e-4 else None


MARGIN = 0.03  # a candidate replaces the tables' choice only when it is this much faster (timing noise)


def tune(cfg, dev, measure=None, progress=None) -> tuple[list[TuneRow], object]:
    """Measure every candidate of every shape the config's programs choose tiles for, cache the
    fastest per shape (catchat/vk/tune.py; the tables' choice unless one is MARGIN faster), and
    return (the rows, the cache file). measure(kind, shape, tiles) -> seconds or None (default: a
    `Measurer`; the tables' choice is timed first, and is the reference the others must match)."""
    progress = progress or NoProgress()
    progress.step("collecting the config's tile choices")
    shapes = tune_shapes(cfg, dev)
    measure = measure or Measurer(dev, steps=min(cfg.data.window, 128), precision=cfg.train.precision)
    rows, chosen, measured = [], {k: {} for k in tunecache.KINDS}, {}
    for (kind, key), shape in sorted(shapes.items()):
        table, cands = candidates_of(dev, kind, shape)
        cands = [table] + [c for c in cands if c != table] if table in cands else cands
        row = TuneRow(kind, key, table, cands)
        for c in cands:
            progress.step(f"{kind} {key}: {tuple(row.fields(c))}")
            row.seconds.append(measure(kind, shape, c) if len(cands) > 1 else None)
        if len(cands) > 1 and row.seconds[0] is not None:
            # the first candidate ran on a GPU coming out of the host's set-up (clocks ramping: on the
            # H200 up to 4.7x slower); timed again after the others, it keeps its faster time
            again = measure(kind, shape, cands[0])
            row.seconds[0] = min(row.seconds[0], again) if again is not None else row.seconds[0]
        timed = [(s, i) for i, s in enumerate(row.seconds) if s is not None]
        if timed:
            best, i = min(timed)
            base = row.seconds[0] if cands[0] == table else None
            row.winner = table if base is not None and best > base * (1 - MARGIN) else cands[i]
            chosen[kind][key] = row.form(row.winner)
            measured[f"{kind}/{key}"] = [[row.form(c), None if s is None else round(s * 1e6, 2)]
                                         for c, s in zip(cands, row.seconds)]
        rows.append(row)
    path = tunecache.store(dev.info, chosen, measured)
    return rows, path
