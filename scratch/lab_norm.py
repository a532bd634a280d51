import sys
import numpy as np
sys.path.insert(0, '.'); sys.path.insert(0, 'tools')
from bench import timed_sequence
from catchat.vk.device import open_device
from catchat.vk.kernels.norm import ResidualRmsNormForward, ResidualRmsNormBackward
from catchat.vk.kernels.dropout import make_hyper
import inspect
dev = open_device(None)
T, B, H = int(sys.argv[1]) if len(sys.argv) > 1 else 1024, 64, 512
R = T * B
rng = np.random.default_rng(0)
f = lambda n: dev.tensor(rng.standard_normal(n).astype(np.float32))
x, o, out, dout, dx, do, params, grads = f(R*H), f(R*H), f(R*H), f(R*H), f(R*H), f(R*H), f(4*H), f(4*H)
rstd = dev.tensor(np.ones(R, np.float32))
print(inspect.signature(make_hyper))
hyper = dev.tensor(make_hyper(seed=1, p_hid=0.15), np.uint32)
dev.upload([x, o, out, dout, dx, do, params, grads, rstd, hyper])
for wg, rpw in ((256, None), (256, 8), (128, None), (128, 4), (128, 16), (64, 4), (64, 16), (512, 4)):
    k = ResidualRmsNormForward(dev, x, o, params, hyper, out, rstd, T=T, B=B, H=H, layer=0, g_off=0, wg=wg, rows_per_wg=rpw)
    print(f"forward  wg {wg:3d} rpw {str(rpw):5s}: {timed_sequence(dev, k.ops() * 5, 7) / 5 * 1e3:.3f} ms", flush=True)
for wg, rpw in ((256, None), (128, None), (64, None), (256, 128), (128, 128), (64, 128), (512, None)):
    k = ResidualRmsNormBackward(dev, x, o, params, hyper, rstd, dout, dx, do, grads, T=T, B=B, H=H, layer=0, g_off=0, wg=wg, rows_per_wg=rpw)
    print(f"backward wg {wg:3d} rpw {str(rpw):5s}: {timed_sequence(dev, k.ops() * 5, 7) / 5 * 1e3:.3f} ms", flush=True)
