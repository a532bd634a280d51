"""The tile pickers read catchat/vk/tiles.py's rows: the choices on the H200's device description and on
lavapipe's, for every GEMM and sweep shape of configs tiny, v3 and v5 (training, eval, generation), are
frozen in tests/tile_choices.json (computed with the tile constants before they became data)."""

import json
from pathlib import Path
from types import SimpleNamespace

from catchat.vk.kernels import gemm, gru
from catchat.vk.probe import DeviceInfo

FROZEN = Path(__file__).with_name("tile_choices.json")

H200 = DeviceInfo(index=0, name="NVIDIA H200", type="discrete GPU", vendor="NVIDIA", driver="580.159.04",
                  api_version="1.4.312", max_storage_buffer_bytes=2**32 - 1, max_shared_memory_bytes=49152,
                  max_push_constant_bytes=256, max_workgroup_invocations=1024, subgroup_size=32,
                  device_memory_bytes=150 << 30, compute_units=132)
LAVAPIPE = DeviceInfo(index=0, name="llvmpipe (LLVM 15.0.6, 256 bits)", type="CPU", vendor="Mesa",
                      driver="llvmpipe Mesa 22.3.6 (LLVM 15.0.6)", api_version="1.3.230",
                      max_storage_buffer_bytes=2**27, max_shared_memory_bytes=32768, max_push_constant_bytes=256,
                      max_workgroup_invocations=1024, subgroup_size=8)
CONFIGS = {"tiny": (64, 2, 64, 32), "v3": (512, 3, 1024, 64), "v5": (2048, 3, 1024, 32)}  # H, L, T, B
V = 101

def gemm_shapes(H, T, B):
    out = []
    for R in (T * B, B, 64 * B):  # batched window, a timestep's row block, a generation prefill window
        out += [(R, 3 * H, H, 1), (R, V, H, 1), (R, H, V, 1), (R, H, 3 * H, 1)]
    out += [(V, 3 * H, H, 1), (3 * H, H, V, 1), (V, H, 3 * H, 1)]
    return out

def choices(info):
    dev = SimpleNamespace(info=info)
    res = {}
    for cname, (H, _L, T, B) in CONFIGS.items():
        R = T * B
        sk_w, sk_h = gemm.gemm_split_k(dev, 3 * H, H, R), gemm.gemm_split_k(dev, V, H, R)
        cs = gemm.colsum_splits(dev, R, 3 * H)
        g = {}
        for M, N, K, _ in gemm_shapes(H, T, B) + [(3 * H, H, R, sk_w), (V, H, R, sk_h)]:
            sk = 1 if (M, N, K) not in ((3 * H, H, R), (V, H, R)) else (sk_w if M == 3 * H else sk_h)
            t = gemm.gemm_tiles(dev, M, N, sk)
            g[f"{M}x{N}x{K}/{sk}"] = [t.bm, t.bn, t.bk, t.tm, t.tn]
        sweeps = {}
        for b in (B, 1, 4):  # training / eval lanes, one generation stream, four
            for backward in (False, True):
                for resident in sorted({gru.device_sms(dev), 0}):
                    t = gru.default_tiles(dev, b, H, backward, resident)
                    sweeps[f"B{b}/{'bwd' if backward else 'fwd'}/wg{resident}"] = [type(t).__name__, list(t)]
        res[cname] = {"split_k": [sk_w, sk_h], "colsum": cs, "colsum_geometry": list(gemm.colsum_geometry(dev)),
                      "gemm": g, "gru": sweeps}
    return res



def test_tile_choices_are_frozen(monkeypatch):
    monkeypatch.delenv("CATCHAT_PERSISTENT", raising=False)
    want = json.loads(FROZEN.read_text())
    assert choices(H200) == want["h200"]
    assert choices(LAVAPIPE) == want["lavapipe"]
