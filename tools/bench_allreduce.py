"""Time catchat's gradient exchange (catchat.distributed.Comm.sum_grads: Alltoall, float32 sum in rank
order, Allgather) on host buffers of the size of each config's gradient, without a GPU:

    mpiexec -n 2 .venv/bin/python tools/bench_allreduce.py [CONFIG ...] [--repeat N]

Prints, on rank 0, ms per exchange (median of N) and the bytes each rank sends, per config. The
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
from catchat.data import vocab
from catchat.model import ParamLayout  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=["configs/tiny.toml", "configs/catchat-v3.toml",
                                                   "configs/catchat-v5.toml"])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    comm = distributed.init(force=True)
    for path in args.configs:
        cfg = cfgmod.load(path, [])
        P = ParamLayout(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE)).total
        g = np.random.default_rng(comm.rank).standard_normal(P).astype(np.float32)
        comm.sum_grads(g)  # warm-up: buffers, connections
        times = []
        for _ in range(args.repeat):
            comm.barrier("bench")
            t = time.perf_counter()
            comm.sum_grads(g)
            times.append(time.perf_counter() - t)
        if comm.is_root:
            sent = 2 * (comm.size - 1) / comm.size * 4 * P
            print(f"{Path(path).stem}: P = {P:,} ({4 * P / 1e6:.1f} MB), {comm.size} ranks: "
                  f"{1e3 * statistics.median(times):.1f} ms per exchange, {sent / 1e6:.1f} MB sent per rank",
                  flush=True)
    comm.finish()


if __name__ == "__main__":
    main()
