"""The GPU program's traffic with the host: parameters, optimizer state and the carried state in and
out, buffers read back by name, and the submits (a failed submit or wait is DeviceLost naming what it
was). `Program` (driver.py) is a ProgramIO; this base holds no state of its own: it reads the
program's `dev`, `buffers`, `seq_set_params`, `spec`, `B` and `training`."""

from __future__ import annotations

import numpy as np

from catchat.model import spectral_u_init
from catchat.vk.device import host_view


class ProgramIO:
    """Host-side reads, writes and submits of a Program."""

    def _sync(self, tensors, to_device: bool):
        kp = self.dev.kp
        op = kp.OpTensorSyncDevice(tensors) if to_device else kp.OpTensorSyncLocal(tensors)
        self._eval(self.dev.sequence(), "an upload" if to_device else "a download", op)

    def _eval(self, seq, what: str, *op) -> None:
        """seq.eval() (Device.run: a failed submit or wait is DeviceLost naming `what`)."""
        self.dev.run(lambda: seq.eval(*op), what)

    def _eval_while(self, seq, what: str, host_work) -> None:
        """seq.eval() with host_work() done while it runs (kp patch 0004's eval_async); a kp without
        it: after it. host_work's exceptions propagate once seq has finished."""
        if not self.dev.evals_async:
            self._eval(seq, what)
            host_work()
            return
        self.dev.run(seq.eval_async, what)
        try:
            host_work()
        finally:
            self.dev.run(seq.eval_await, what)

    def _put(self, tensor, array, dtype=np.float32):
        host_view(tensor)[:] = np.asarray(array, dtype=dtype).ravel()

    def set_params(self, flat: np.ndarray) -> None:
        """Upload parameters (flat ParamLayout order) and rebuild what derives from them (table0)."""
        self._put(self.buffers.params, flat)
        self._eval(self.seq_set_params, "a parameter upload")

    def set_optimizer_state(self, m: np.ndarray, v: np.ndarray, u: np.ndarray | None = None) -> None:
        """Upload Adam moments and (optionally) the spectral-norm vectors."""
        self._put(self.buffers.m, m)
        self._put(self.buffers.v, v)
        self._put(self.buffers.u, spectral_u_init(self.spec) if u is None else u)
        self._sync([self.buffers.m, self.buffers.v, self.buffers.u], True)

    def set_carry(self, h0: np.ndarray | None) -> None:
        """Upload the carried hidden state [L,B,H] (None: zeros)."""
        self._put(self.buffers.h0, np.zeros(self.buffers.h0.size(), np.float32) if h0 is None else h0)
        self._sync([self.buffers.h0], True)

    def read(self, *names: str) -> list[np.ndarray]:
        """Download buffers by attribute name ('params', 'grads', 'h0', 'logits', ...) as host copies."""
        tensors = [getattr(self.buffers, n) for n in names]
        if any(t is None for t in tensors):
            raise ValueError(f"{', '.join(names)}: not every buffer exists in this program (training={self.training})")
        self._sync(tensors, False)
        return [host_view(t).copy() for t in tensors]

    def get_params(self) -> np.ndarray:
        return self.read("params")[0]

    def get_optimizer_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(self.read("m", "v", "u"))

    def get_carry(self) -> np.ndarray:
        L, H = self.spec.layers, self.spec.hidden
        return self.read("h0")[0].reshape(L, self.B, H)
