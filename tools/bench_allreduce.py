"""Time catchat's gradient exchange (catchat.distributed.Comm.sum_grads: Alltoall, float32 sum in rank
order, Allgather; catchat/exchange.py) on host buffers of the size of each config's gradient, without a GPU:

    mpiexec -n 2 .venv/bin/python tools/bench_allreduce.py [CONFIG ...] [--repeat N] [--dtype fp16] [--hierarchical]

Prints, on rank 0, ms per exchange (median of N) and the bytes each rank sends, per config: the sum
written into a host buffer of its own, as a training step writes it into the gradient's host copy. The
device's download and upload of the gradient (PCIe) come on top: docs/distributed.md adds them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import config as cfgmod  # noqa: E402
from catchat import distributed  # noqa: E402
from catchat.data import vocab  # noqa: E402
from catchat.exchange import EXCHANGE_DTYPES  # noqa: E402
from catchat.model import ParamLayout  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=["configs/tiny.toml", "configs/catchat-v3.toml",
                                                   "configs/catchat-v5.toml"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dtype", choices=EXCHANGE_DTYPES, default="fp32", help="distributed.exchange_dtype")
    ap.add_argument("--hierarchical", action="store_true", help="distributed.hierarchical")
    args = ap.parse_args()
    comm = distributed.init(force=True)
    comm.set_exchange(args.dtype, args.hierarchical)
    for path in args.configs:
        cfg = cfgmod.load(path, [])
        P = ParamLayout(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE)).total
        g = np.random.default_rng(comm.rank).standard_normal(P).astype(np.float32)
        host = np.empty_like(g)  # as a training step does: the staged range in, the gradient's host copy out
        comm.sum_grads(g, out=host)  # warm-up: buffers, connections
        times = []
        for _ in range(args.repeat):
            comm.barrier("bench")
            t = time.perf_counter()
            comm.sum_grads(g, out=host)
            times.append(time.perf_counter() - t)
        if comm.is_root:
            sent = 2 * (comm.size - 1) / comm.size * (2 if args.dtype == "fp16" else 4) * P
            print(f"{Path(path).stem}: P = {P:,} ({4 * P / 1e6:.1f} MB), {comm.size} ranks, {args.dtype}: "
                  f"{1e3 * statistics.median(times):.1f} ms per exchange, {sent / 1e6:.1f} MB sent per rank",
                  flush=True)
    comm.finish()


if __name__ == "__main__":
    main()
