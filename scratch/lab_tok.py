import sys, time
import numpy as np
sys.path.insert(0, '.'); sys.path.insert(0, 'tools')
from bench import timed_sequence
from shader_stats import print_statistics
from catchat.vk.device import open_device
from catchat.vk.kernels import embedding as emb
from catchat.vk.kernels.embedding import EmbeddingBackward
from catchat.vk.kernels.gemm import ColSum, colsum_splits

dev = open_device(None)
R, V, W = 65536, 101, 1536
rng = np.random.default_rng(0)
tok = dev.tensor(rng.integers(0, V, R).astype(np.uint32), np.uint32)
dx = dev.tensor(rng.standard_normal(R * W).astype(np.float32))
dE = dev.tensor(np.zeros(V * W, np.float32))
hyper = dev.tensor(emb.hyper_words(1, 0.0), np.uint32)
dev.upload([tok, dx, dE, hyper])
for label, kw in [("default", {}), ("chunks16", dict(chunks=16)), ("chunks128", dict(chunks=128)), ("chunks1", dict(chunks=1))]:
    k = EmbeddingBackward(dev, (tok, 0), (dx, 0), (dE, 0), hyper, R, V, W, scale_h=512, **kw)
    ops = k.ops()
    t_all = timed_sequence(dev, ops * 5, 7) / 5
    t_1 = timed_sequence(dev, ops[:1] * 5, 7) / 5
    print(f"{label:20s} chunks {k.chunks:3d}  both {t_all*1e3:7.3f} ms  pass1 {t_1*1e3:7.3f} ms", flush=True)
    if label == "default":
        print_statistics(dev, k, "embedding backward pass 1", {})
for splits in (colsum_splits(dev, R, W), 8, 64):
    c = ColSum(dev, (dx, 0, W), (dE, 0), R, W, row_splits=splits)
    print(f"colsum splits {c.splits}: {timed_sequence(dev, c.ops() * 5, 7) / 5 * 1e3:.3f} ms", flush=True)
print_statistics(dev, c, "colsum", {})
