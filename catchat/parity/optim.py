"""The optimizer step (glsl/grad_norm.comp, glsl/optimizer.comp, glsl/spectral.comp) against
catchat.model.reference: grad norm, AdamW/NAdam steps with clipping and decay, spectral projection."""

from __future__ import annotations

import math

import numpy as np

from catchat.model import ModelSpec, ParamLayout, init_params, reference, spectral_u_init
from catchat.parity import ParityResult, compare
from catchat.vk import slots
from catchat.vk.device import Device, host_view
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.optim import (
    OPTIMIZERS,
    GradNorm,
    Optimizer,
    SpectralProject,
    decay_words,
    optimizer_hyper_words,
)


def hyper_buffer(words: dict[int, np.uint32], n_valid: int) -> np.ndarray:
    """A full hyper array [HP_WORDS] from optimizer_hyper_words plus the step's valid count."""
    out = np.zeros(slots.HP_WORDS, np.uint32)
    for slot, word in words.items():
        out[slot] = word
    out[slots.HP_N_VALID] = n_valid
    return out


def layout_grads(layout: ParamLayout, rng, scale: float) -> np.ndarray:
    """Random gradients [total] in the layout, zero in the alignment padding (as real gradients)."""
    g = np.zeros(layout.total, np.float32)
    for name in layout.names:
        o, n = layout.offsets[name], layout.sizes[name]
        g[o:o + n] = rng.standard_normal(n) * scale
    return g


# Tiny workgroups, few groups: every strided loop and multi-partial path runs at test sizes.
SMALL_GEOMETRY = dict(norm=dict(workgroup=8, items=2), opt=dict(workgroup=8, max_groups=3),
                      spectral=dict(workgroup=8, rows=3, max_tiles=2))
DEFAULT_GEOMETRY = dict(norm={}, opt={}, spectral={})


class StepRig:
    """GradNorm -> Optimizer -> SpectralProject on device buffers of one layout (tests share it)."""

    def __init__(self, dev: Device, layout: ParamLayout, kind: str, params: np.ndarray,
                 geometry: dict = DEFAULT_GEOMETRY):
        self.dev, self.layout = dev, layout
        n = layout.total
        self.params, self.grads = dev.tensor(params), dev.tensor(n)
        self.m, self.v = dev.tensor(n), dev.tensor(n)
        self.mask = dev.tensor(decay_words(layout), np.uint32)
        self.hyper = dev.tensor(slots.HP_WORDS, np.uint32)
        self.stats = dev.tensor(slots.ST_WORDS, np.uint32)
        self.u = dev.tensor(spectral_u_init(layout.spec))
        self.norm = GradNorm(dev, self.grads, self.stats, n, **geometry["norm"])
        self.opt = Optimizer(dev, self.params, self.grads, self.m, self.v, self.mask, self.hyper,
                             self.stats, n, kind, **geometry["opt"])
        self.spectral = SpectralProject(dev, self.params, layout, self.u, self.hyper, self.stats,
                                        **geometry["spectral"])
        run_ops(dev, [self.params, self.m, self.v, self.mask, self.u], [], [self.params])

    def step(self, grads: np.ndarray, hyper: np.ndarray) -> np.ndarray:
        """Upload grads + hyper, zero stats, run the whole chain; returns the stats words."""
        host_view(self.grads)[:] = grads
        host_view(self.hyper)[:] = hyper
        host_view(self.stats)[:] = 0
        ops = self.norm() + [self.opt()] + self.spectral()
        (stats,) = run_ops(self.dev, [self.grads, self.hyper, self.stats], ops, [self.stats])
        return stats

    def download(self) -> dict[str, np.ndarray]:
        p, m, v, u = run_ops(self.dev, [], [], [self.params, self.m, self.v, self.u])
        return dict(params=p, m=m, v=v, u=u)


def _grad_norm_checks(dev: Device) -> list[ParityResult]:
    """Squared norm at sizes around the workgroup (256) and pass-1 chunk (2048 elements, 8192 with vec4
    items) boundaries, and with more partials than pass-2 threads (the Kahan loop)."""
    rng = np.random.default_rng(1)
    out = []
    sizes = ((1, 0), (255, 0), (257, 3), (2047, 0), (2049, 16), (20001, 5), (600_001, 0))  # 293 partials
    sizes += ((4, 0), (2048, 4), (8196, 8), (20000, 2), (600_000, 0))  # vec4 items (not at offset 2): 74 partials
    cases = [(n, off, DEFAULT_GEOMETRY) for n, off in sizes]
    cases += [(n, off, SMALL_GEOMETRY) for n, off in ((1, 0), (17, 1), (1001, 0), (1000, 0))]  # 63 / 16 partials
    for n, offset, geo in cases:
        g = (rng.standard_normal(offset + n) * rng.uniform(0.1, 10.0)).astype(np.float32)
        tg, ts = dev.tensor(g), dev.tensor(slots.ST_WORDS, np.uint32)
        (stats,) = run_ops(dev, [tg, ts], GradNorm(dev, tg, ts, n, offset, **geo["norm"])(), [ts])
        want = reference.grad_norm(g[offset:]) ** 2
        out.append(compare("grad_norm_sq", f"n={n},off={offset},wg={geo['norm'].get('workgroup', 256)}",
                           slots.word_f32(stats, slots.ST_GRAD_NORM_SQ), want, 0.0, 2e-6))
    return out


def _optimizer_checks(dev: Device) -> list[ParityResult]:
    """3 consecutive steps vs reference.adamw_step / nadam_step with weight decay and the layout's
    decay mask: clipping off (step 1), binding (step 2, clip = norm / 2), not binding (step 3)."""
    out = []
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.99, 1e-8, 0.1
    for hidden, geo in ((5, DEFAULT_GEOMETRY), (33, DEFAULT_GEOMETRY), (33, SMALL_GEOMETRY)):
        layout = ParamLayout(ModelSpec(vocab_size=11, hidden=hidden, layers=2))
        flat0 = layout.flatten(init_params(layout.spec, seed=hidden))
        mask = layout.decay_mask()
        for kind in OPTIMIZERS:
            rng = np.random.default_rng(hidden)
            rig = StepRig(dev, layout, kind, flat0, geo)
            p, m, v = flat0.copy(), np.zeros_like(flat0), np.zeros_like(flat0)
            for t, clip_ratio in ((1, 0.0), (2, 0.5), (3, 3.0)):  # clip off / binding / not binding
                g = layout_grads(layout, rng, 0.1 * t)
                norm = reference.grad_norm(g)
                clip = clip_ratio * norm
                words = optimizer_hyper_words(kind, t, lr, b1, b2, eps, wd, clip)
                stats = rig.step(g, hyper_buffer(words, n_valid=7))
                scale = reference.clip_scale(norm, clip)
                gs = g * scale
                if kind == "adamw":
                    reference.adamw_step(p, gs, m, v, t, lr, b1, b2, eps, wd, mask)
                else:
                    reference.nadam_step(p, gs, m, v, t, lr, b1, b2, eps, wd, mask,
                                         *reference.nadam_coefficients(t, b1))
                got = rig.download()
                where = (f"H={hidden},t={t},clip={('off', 'binds', 'free')[t - 1]}"
                         f"{',small-wg' if geo is SMALL_GEOMETRY else ''}")
                out.append(compare(f"{kind}.clip_scale", where,
                                   slots.word_f32(stats, slots.ST_CLIP_SCALE), scale, 0.0, 2e-6))
                out.append(compare(f"{kind}.params", where, got["params"], p, 1e-6, 1e-6))
                out.append(compare(f"{kind}.m", where, got["m"], m, 1e-7, 1e-5))
                out.append(compare(f"{kind}.v", where, got["v"], v, 1e-9, 1e-5))
    return out


def block_sigmas(flat: np.ndarray, layout: ParamLayout, u: np.ndarray) -> np.ndarray:
    """sigma of one power-iteration step for every gate block [L*6], float64 (picks test bounds)."""
    H, out = layout.spec.hidden, []
    for l in range(layout.spec.layers):
        for k, which in enumerate(("weight_ih", "weight_hh")):
            W = layout.view(flat, f"layers.{l}.gru.{which}").astype(np.float64)
            for gate in range(3):
                Wb = W[gate * H:(gate + 1) * H]
                vv = Wb.T @ u[l, k, gate]
                wv = Wb @ (vv / np.linalg.norm(vv))
                out.append(np.linalg.norm(wv))
    return np.array(out)


def spectral_case(layout: ParamLayout, seed: int) -> tuple[np.ndarray, float]:
    """Parameters whose gate blocks have well-separated sigmas and a bound between the middle two."""
    flat = layout.flatten(init_params(layout.spec, seed=seed))
    H = layout.spec.hidden
    for l in range(layout.spec.layers):
        for k, which in enumerate(("weight_ih", "weight_hh")):
            W = layout.view(flat, f"layers.{l}.gru.{which}")
            for gate in range(3):
                W[gate * H:(gate + 1) * H] *= np.float32(1.0 + 0.5 * (l * 6 + k * 3 + gate))
    s = np.sort(block_sigmas(flat, layout, spectral_u_init(layout.spec)))
    mid = len(s) // 2
    return flat, float(math.sqrt(s[mid - 1] * s[mid]))


def _spectral_checks(dev: Device) -> list[ParityResult]:
    """Two consecutive projections (u persists) vs reference.spectral_project_model, bound binding
    for half of the blocks; the optimizer runs first with lr = 0 so params pass through unchanged."""
    out = []
    for hidden, geo in ((5, DEFAULT_GEOMETRY), (33, DEFAULT_GEOMETRY), (33, SMALL_GEOMETRY)):
        layout = ParamLayout(ModelSpec(vocab_size=11, hidden=hidden, layers=2))
        flat, bound = spectral_case(layout, seed=hidden)
        rig = StepRig(dev, layout, "adamw", flat, geo)
        p, u = flat.copy(), spectral_u_init(layout.spec)
        words = optimizer_hyper_words("adamw", 1, 0.0, 0.9, 0.99, 1e-8, 0.0, 0.0, spectral_bound=bound)
        for rep in range(2):
            rig.step(np.zeros(layout.total, np.float32), hyper_buffer(words, n_valid=1))
            reference.spectral_project_model(p, layout, u, bound)
            got = rig.download()
            where = f"H={hidden},rep={rep}{',small-wg' if geo is SMALL_GEOMETRY else ''}"
            out.append(compare("spectral.params", where, got["params"], p, 1e-6, 1e-6))
            out.append(compare("spectral.u", where, got["u"], u.ravel(), 1e-6, 1e-5))
    return out


def parity_checks(dev: Device) -> list[ParityResult]:
    """Grad norm, AdamW/NAdam steps with clipping and decay, spectral projection vs catchat.model.reference."""
    return _grad_norm_checks(dev) + _optimizer_checks(dev) + _spectral_checks(dev)
