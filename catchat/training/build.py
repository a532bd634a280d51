"""What a run trains with, built from its config: the corpus, the train and eval lanes, the model's
parameter layout and this process's Program (its share of the lanes), and a fresh start's state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from catchat import config as cfgmod
from catchat.data import vocab
from catchat.data.corpus import open_corpus
from catchat.data.lanes import Lanes
from catchat.model import ParamLayout, init_params
from catchat.precision import LossScaler
from catchat.training.evals import eval_lanes
from catchat.training.ranks import OneProcess
from catchat.training.state import RunState
from catchat.vk.kernels.gemm import coopmat_runs, products
from catchat.vk.program import Program


@dataclass
class Setup:
    corpus: object  # catchat.data.corpus's store of the corpus
    lanes: Lanes  # the train split's lanes (all of them, on every rank)
    eval_lanes: Lanes | None  # the eval split's, where evals need them
    total_steps: int  # planned (a budgeted run: a step cap, 0 = none)
    layout: ParamLayout  # the model's parameters (layout.spec: its sizes)
    prog: Program  # this process's share of the lanes on the device
    products: str  # how the GEMMs multiply (train.precision on this device), for the start event
    tokens_per_step: int


def build(cfg: cfgmod.Config, dev, ranks: OneProcess, report) -> Setup:
    """Corpus, lanes (all of them, on every rank), this rank's share of them (`ranks.split`) and its Program."""
    corpus = open_corpus(cfg.data.corpus, on_build=lambda s: report("corpus", lines=s.lines()))
    lanes = Lanes.from_config(corpus, cfg, "train")
    evals = eval_lanes(corpus, cfg)
    total_steps = cfgmod.planned_total_steps(cfg, lanes.seqs_per_cycle)
    layout = ParamLayout(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE))
    B = cfg.data.batch_lanes
    ranks.split(B)
    ranks.configure(cfg)
    lo, hi = ranks.share
    overlap = ranks.overlaps(cfg)
    prog = Program(dev, layout, cfg.data.window, hi - lo, optimizer=cfg.train.optimizer,
                   lane_offset=lo, lanes_total=B, precision=cfg.train.precision, grad_groups=overlap)
    if overlap and prog.grad_stages is None and ranks.is_root:
        report("warning", text="distributed.overlap: this kp cannot submit without waiting (kp patch 0004, "
                               "tools/kp-patches): the gradient is exchanged after the backward")
    made = products(dev, cfg.train.precision)
    if ranks.is_root and cfg.train.precision == "fp16" and not coopmat_runs(dev):  # the user asked for speed
        report("warning", text=f"precision fp16 on {dev.info.name}: {made}")
    return Setup(corpus=corpus, lanes=lanes, eval_lanes=evals, total_steps=total_steps, layout=layout, prog=prog,
                 products=made, tokens_per_step=cfgmod.seqs_per_step(cfg) * cfg.data.window)


def fresh(setup: Setup, cfg: cfgmod.Config, ranks: OneProcess) -> RunState:
    """A new run: initialised parameters, zero optimizer state and carry, step 0 at the lanes' start."""
    layout = setup.layout
    flat = layout.flatten(init_params(layout.spec, cfg.train.seed))
    setup.prog.set_params(flat)
    setup.prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    setup.prog.set_carry(ranks.my_carry(None))
    return RunState(cursor=setup.lanes.start(), scaler=LossScaler() if cfg.train.precision == "fp16" else None)
