"""The trainer as the only process of a run (`OneProcess`) or as one rank of a data-parallel run
(`Ranks`; catchat/distributed.py, docs/distributed.md). The loop is given one of them and asks it
the same questions either way: which lanes are this process's, how a step's gradients and
statistics are added up, whether to stop, where a checkpoint's carried state comes from.

With ranks, every rank cuts the same global windows and trains its share of the lanes (its
columns, its carried state); the gradient sums meet in `Comm.sum_grads` before the one optimizer
step every rank applies. Rank 0 alone holds the run directory (lock, telemetry, samples,
checkpoints): at start-up it loads or initialises the state and sends it to the others; a
checkpoint gathers every lane's carried state to it. Stopping (Ctrl-C, SIGTERM) is agreed after
each step, so all ranks stop after the same step.
"""

from __future__ import annotations

import numpy as np

from catchat import config as cfgmod
from catchat import distributed
from catchat.data.lanes import Lanes
from catchat.errors import UsageError
from catchat.training.state import RunState
from catchat.vk.program import Program, StepStats
from catchat.vk.program.grad_slices import ExchangeTimes


class OneProcess:
    """The only process of a run: every lane is its own, nothing is exchanged."""

    comm = None
    size, rank, is_root = 1, 0, True
    reduce_grads = None  # the step's gradients are this process's alone

    def __init__(self, signals):
        self.signals = signals  # the StopSignals of this process
        self.shares: list[tuple[int, int]] = []
        self.share = (0, 0)

    def split(self, lanes_total: int) -> None:
        """Each rank's lanes [lo, hi) of the B lanes (`shares`), and this process's (`share`)."""
        self.shares = [distributed.lane_share(lanes_total, self.size, r) for r in range(self.size)]
        self.share = self.shares[self.rank]

    def my_carry(self, carry: np.ndarray | None) -> np.ndarray | None:
        """This process's lanes of the carried state [L, B, H] of all lanes (None: zeros)."""
        lo, hi = self.share
        return None if carry is None else np.ascontiguousarray(carry[:, lo:hi])

    def mine(self, batches: list) -> list:
        """This process's lanes of a step's micro-batches."""
        return batches

    def configure(self, cfg: cfgmod.Config) -> None:
        """The gradient exchange as the config's [distributed] section says (here: nothing to exchange)."""

    def overlaps(self, cfg: cfgmod.Config) -> bool:
        """Whether the program runs its last micro-batch in backward groups, to exchange each group's
        gradient while the GPU runs the next (one process: never, it has nothing to exchange)."""
        return False

    def add_up(self, st: StepStats, seconds: float, global_step: int, times: ExchangeTimes) -> StepStats:
        """The whole step's stats (here: this process's own)."""
        return st

    def stopping(self) -> str | None:
        """The signal that stops the run before the next step (None: go on)."""
        return self.signals.caught

    def gather_carry(self, carry: np.ndarray) -> np.ndarray | None:
        """Every lane's carried state for a checkpoint (here: this process's)."""
        return carry

    def refuse_budget(self, cfg: cfgmod.Config) -> None:
        """A time budget runs on one process's clock: allowed here."""

    def send_start(self, cfg: cfgmod.Config, prog: Program, state: RunState, carry: np.ndarray | None) -> None:
        """Nobody to send the start state to."""

    def refused(self) -> None:
        """A refused start: nobody to tell."""

    def info(self) -> dict:
        """The start and resume events' account of the ranks (none)."""
        return {}

    def end_fields(self) -> dict:
        """The end event's account of the gradient exchange (none)."""
        return {}


class Ranks(OneProcess):
    """One rank of a data-parallel run."""

    def __init__(self, comm: distributed.Comm, signals):
        super().__init__(signals)
        self.comm = comm
        self.size, self.rank, self.is_root = comm.size, comm.rank, comm.is_root
        self.reduce_grads = comm.sum_grads
        self.shared = False  # rank 0 sent its start state (or its refusal)
        self.agreed: str | None = None  # the signal some rank got, agreed after a step
        self.exchange = dict(wait_s=0.0, exchange_s=0.0, transfer_s=0.0, exposed_s=0.0, step_s=0.0, steps=0)
        self.first_step = True  # this process's first step pays one-time costs: left out of `exchange`
        self.settings = {}  # the exchange's [distributed] settings, for the end event

    def configure(self, cfg: cfgmod.Config) -> None:
        d = cfg.distributed
        self.comm.set_exchange(d.exchange_dtype, d.hierarchical)
        self.settings = dict(overlap=d.overlap, exchange_dtype=d.exchange_dtype, hierarchical=d.hierarchical)

    def overlaps(self, cfg: cfgmod.Config) -> bool:
        return cfg.distributed.overlap

    def mine(self, batches: list) -> list:
        """This rank's lanes of every window; the ranks' gradients are added."""
        lo, hi = self.share
        return [tuple(np.ascontiguousarray(a[:, lo:hi]) for a in batch) for batch in batches]

    def add_up(self, st: StepStats, seconds: float, global_step: int, times: ExchangeTimes) -> StepStats:
        """The whole step's stats from every rank's share (added in rank order), and the agreement on
        stopping: a signal any rank got before this point stops every rank after this step. `times`:
        the step's exchange as the program timed it (Program.exchange.times)."""
        timing = self.comm.take_timing()  # this step's sum_grads calls
        # held up: from the GPU's end to the gradient's return, but for the waits for a slower rank
        exposed = times.done - times.gpu_done - timing.wait_within(times.gpu_done, times.done)
        mine = (st.loss, st.n_valid, st.top1, st.top5, st.clamp_hits, st.tf_model_fed,
                1.0 if self.signals.caught else 0.0, timing.wait_s, timing.exchange_s,
                times.host_s - timing.wait_s - timing.exchange_s, exposed, seconds)
        tot = self.comm.sum_rows(mine, f"adding up step {global_step + 1}")
        if tot[6] > 0 and self.agreed is None:
            self.agreed = self.signals.caught or "a signal to another rank"
        if not self.first_step:
            for i, key in enumerate(("wait_s", "exchange_s", "transfer_s", "exposed_s", "step_s"), 7):
                self.exchange[key] += tot[i] / self.comm.size  # the ranks' mean
            self.exchange["steps"] += 1
        self.first_step = False
        return StepStats(loss=float(tot[0]), n_valid=int(tot[1]), top1=int(tot[2]), top5=int(tot[3]),
                         grad_norm=st.grad_norm, clip_scale=st.clip_scale, skipped=st.skipped,
                         clamp_hits=int(tot[4]), tf_model_fed=int(tot[5]))

    def stopping(self) -> str | None:
        """The signal the ranks agreed on after the last step (so that every rank stops after the same step)."""
        return self.agreed

    def gather_carry(self, carry: np.ndarray) -> np.ndarray | None:
        """Every lane's state, in lane order, to rank 0 (the others get None)."""
        return self.comm.gather_lanes(carry, self.shares, "gathering the carried state for a checkpoint")

    def refuse_budget(self, cfg: cfgmod.Config) -> None:
        if cfg.train.time_budget_s > 0:
            raise UsageError(f"a time budget (train.time_budget_s = {cfg.train.time_budget_s:g}) is not supported on "
                             f"{self.comm.size} ranks: each rank's clock would plan its own steps",
                             "train on several ranks with train.total_steps or train.cycles, or on one process "
                             "with the budget")

    def send_start(self, cfg: cfgmod.Config, prog: Program, state: RunState, carry: np.ndarray | None) -> None:
        """Rank 0: send the start state (`start_state`) to the other ranks."""
        self._share(start_state(cfg, prog, state, carry))

    def refused(self) -> None:
        """Rank 0's start failed: the other ranks stop too (quietly: this rank says why)."""
        if not self.shared:
            self._share(None)

    def _share(self, state: dict | None) -> None:
        self.shared = True
        self.comm.bcast_obj(state, "sending the start state", distributed.START_TIMEOUT_S)

    def follow(self) -> dict:
        """A rank other than 0: wait for rank 0's start state (it checks and loads the run). A start
        rank 0 refused ends this rank quietly (rank 0 prints why)."""
        state = self.comm.bcast_obj(None, "waiting for rank 0 to start the run", distributed.START_TIMEOUT_S)
        if state is None:
            raise SystemExit(2)
        return state

    def info(self) -> dict:
        return {"distributed": dict(ranks=self.comm.size, lanes=[list(s) for s in self.shares])}

    def end_fields(self) -> dict:
        """The end event's account of the gradient exchange, ms per step, the ranks' mean: `wait` for
        the slowest rank (its micro-batches, or a backward group), the `exchange` once all are there
        (collectives and the host's sums, hidden behind the GPU or not), the host's `transfer` of the
        gradient (downloads outside the GPU's sequences, uploads), what of them was `exposed` (the
        step held up between the GPU's end and the summed gradient's return, waits aside), the whole
        `step`; `exchange_share` = exposed / step (without overlap: (exchange + transfer) / step),
        and the [distributed] settings. Over the steps after this process's first (`steps`)."""
        e, n = self.exchange, max(self.exchange["steps"], 1)
        ms = {f"{k[:-2]}_ms_per_step": round(1e3 * e[k] / n, 3)
              for k in ("wait_s", "exchange_s", "transfer_s", "exposed_s", "step_s")}
        share = e["exposed_s"] / e["step_s"] if e["step_s"] else None
        return {"distributed": dict(ranks=self.comm.size, lanes=[list(s) for s in self.shares], steps=e["steps"], **ms,
                                    exchange_share=None if share is None else round(share, 4), **self.settings)}


def start_state(cfg: cfgmod.Config, prog: Program, state: RunState, carry: np.ndarray | None) -> dict:
    """What the other ranks start from: rank 0's config, counters, cursor, parameters, optimizer
    state and every lane's carried state (from a checkpoint, or the fresh initialisation)."""
    m, v, u = prog.get_optimizer_state()
    return dict(cfg=cfg, global_step=state.global_step, applied_steps=state.applied_steps,
                cursor=state.cursor.to_dict(), last_checkpoint_step=state.last_checkpoint_step,
                last_eval_step=state.last_eval_step, params=prog.get_params(), m=m, v=v, u=u, carry=carry,
                scaler=state.scaler)


def take_start_state(sent: dict, prog: Program, lanes: Lanes, ranks: OneProcess) -> RunState:
    """A rank other than 0 takes rank 0's start state into its program (its lanes of the carry)."""
    prog.set_params(sent["params"])
    prog.set_optimizer_state(sent["m"], sent["v"], sent["u"])
    prog.set_carry(ranks.my_carry(sent["carry"]))
    return RunState(cursor=lanes.restore(sent["cursor"]), global_step=sent["global_step"],
                    applied_steps=sent["applied_steps"], last_checkpoint_step=sent["last_checkpoint_step"],
                    last_eval_step=sent["last_eval_step"],
                    scaler=sent["scaler"])  # fp16: every rank scales and unscales by the same S
