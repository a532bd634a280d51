"""The Trainer as one rank of a data-parallel run (catchat/distributed.py, docs/distributed.md):
rank 0 sends its start state to the others, a rank other than 0 follows it, each step's statistics
are added up over the ranks (with the agreement on stopping), and the end event accounts for the
gradient exchange. A mixin of `catchat.train.Trainer`; with self.comm None (one process) none of it
runs.
"""

from __future__ import annotations

from catchat import distributed
from catchat.vk.program import StepStats


class RankedRun:
    """Trainer methods of a data-parallel rank (a mixin: they use the Trainer's state)."""

    def _start_state(self) -> dict:
        """What the other ranks start from: rank 0's config, counters, cursor, parameters, optimizer
        state and every lane's carried state (from a checkpoint, or the fresh initialisation)."""
        m, v, u = self.prog.get_optimizer_state()
        return dict(cfg=self.cfg, global_step=self.global_step, applied_steps=self.applied_steps,
                    cursor=self.cursor.to_dict(), last_checkpoint_step=self.last_checkpoint_step,
                    params=self.prog.get_params(), m=m, v=v, u=u, carry=self._start_carry, scaler=self.scaler)

    def _share_start(self, state: dict | None) -> None:
        """Rank 0: send the start state (None: the start was refused) to the other ranks."""
        self._shared = True
        self.comm.bcast_obj(state, "sending the start state", distributed.START_TIMEOUT_S)

    def _follow(self) -> None:
        """A rank other than 0: wait for rank 0's start state (it checks and loads the run), then build
        the same program over this rank's lanes and take the state. A start rank 0 refused ends this
        rank quietly (rank 0 prints why)."""
        state = self.comm.bcast_obj(None, "waiting for rank 0 to start the run", distributed.START_TIMEOUT_S)
        if state is None:
            raise SystemExit(2)
        self.cfg = state["cfg"]
        self._build(self.cfg)
        self.prog.set_params(state["params"])
        self.prog.set_optimizer_state(state["m"], state["v"], state["u"])
        self._set_carry(state["carry"])
        self.cursor = self.lanes.restore(state["cursor"])
        self.global_step, self.applied_steps = state["global_step"], state["applied_steps"]
        self.last_checkpoint_step = state["last_checkpoint_step"]
        self.scaler = state["scaler"]  # fp16: every rank scales and unscales by the same S
        self.budget = None

    def _add_up(self, st: StepStats, seconds: float) -> StepStats:
        """The whole step's stats from every rank's share (added in rank order), and the agreement on
        stopping: a signal any rank got before this point stops every rank after this step."""
        wait, exchange = self.comm.timing.wait_s, self.comm.timing.exchange_s  # this step's exchange
        mine = (st.loss, st.n_valid, st.top1, st.top5, st.clamp_hits, st.tf_model_fed,
                1.0 if self._stop_signal else 0.0, wait, exchange, self.prog.reduce_s - wait - exchange, seconds)
        tot = self.comm.sum_rows(mine, f"adding up step {self.global_step + 1}")
        if tot[6] > 0 and self._stop_agreed is None:
            self._stop_agreed = self._stop_signal or "a signal to another rank"
        for i, key in enumerate(("wait_s", "exchange_s", "transfer_s", "step_s"), 7):
            self._exchange[key] += tot[i] / self.comm.size  # the ranks' mean
        self._exchange["steps"] += 1
        return StepStats(loss=float(tot[0]), n_valid=int(tot[1]), top1=int(tot[2]), top5=int(tot[3]),
                         grad_norm=st.grad_norm, clip_scale=st.clip_scale, skipped=st.skipped,
                         clamp_hits=int(tot[4]), tf_model_fed=int(tot[5]))

    def _stopping(self) -> str | None:
        """The signal that stops the run before the next step: this process's, or with ranks the one
        they agreed on after the last step (so that every rank stops after the same step)."""
        return self._stop_signal if self.comm is None else self._stop_agreed

    def _exchange_summary(self) -> dict:
        """The end event's account of the gradient exchange (ranks only), ms per step, the ranks' mean:
        `wait` for the slowest rank to finish its micro-batches, the `exchange` once all are there
        (collectives and the host's sum), the `transfer` of the gradient from and to the device, the
        whole `step`; `exchange_share` = (exchange + transfer) / step, what overlap could hide."""
        if self.comm is None:
            return {}
        e, n = self._exchange, max(self._exchange["steps"], 1)
        ms = {f"{k[:-2]}_ms_per_step": round(1e3 * e[k] / n, 3)
              for k in ("wait_s", "exchange_s", "transfer_s", "step_s")}
        share = (e["exchange_s"] + e["transfer_s"]) / e["step_s"] if e["step_s"] else None
        return {"distributed": dict(ranks=self.comm.size, lanes=[list(s) for s in self.shares], **ms,
                                    exchange_share=None if share is None else round(share, 4))}
