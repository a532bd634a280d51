"""The numpy reference model: the oracle every shader is tested against.

Plain, readable, CPU-only. The contract is docs/model.md; shapes are time-major. Each operation
has a `*_forward` and a `*_backward` side by side (llm.c style). Arithmetic follows the dtype of
the parameters passed in (float32 to compare with the GPU, float64 for finite differences).

The families, one module each: `layers` (GEMM operands at a precision, axpby, dropout masks from
catchat.rng, embedding, residual + RMSNorm, head), `gru` (the GRU layer and its sweep backward),
`loss` (cross-entropy with label smoothing), `sampling` (scheduled sampling's and generation's
choice of tokens), `optim` (grad norm, clipping, AdamW / NAdam, spectral bound, the update half of a
step), `model` (the whole model over a window, the per-timestep path's inputs, one training step).
Every name is importable from `catchat.model.reference` itself, as the parity checks and tests use it.

precision "fp16" (train.precision): every product the GPU runs as a GEMM goes through `gemm`,
which rounds both operands to float16 first, as the GPU's GEMMs do; the recurrent products, norms,
loss and optimizer stay in the arithmetic dtype. fp16's loss scale is not modelled: multiplying by a
power of two and dividing again is exact, so the GPU's unscaled gradients match these to tolerance.
"""

from catchat.model.reference.gru import (
    force_saves,
    gru_layer_backward,
    gru_layer_forward,
    gru_step_backward,
    gru_sweep_backward,
    gru_weight_grads,
    whole_dgh,
)
from catchat.model.reference.layers import (
    axpby_reference,
    embedding_backward,
    embedding_forward,
    embedding_keep_mask,
    gemm,
    head_backward,
    head_forward,
    hidden_keep_mask,
    residual_rmsnorm_backward,
    residual_rmsnorm_forward,
)
from catchat.model.reference.loss import cross_entropy_forward_backward
from catchat.model.reference.model import (
    Result,
    dropout_scales,
    model_forward_backward,
    reference_train_step,
    scheduled_sampling_inputs,
)
from catchat.model.reference.optim import (
    MU_PROD_FLOOR,
    adamw_step,
    clip_scale,
    grad_norm,
    nadam_coefficients,
    nadam_step,
    reference_apply_step,
    spectral_project,
    spectral_project_model,
)
from catchat.model.reference.sampling import ngram_banned, sample_choice, tf_select

__all__ = [
    "MU_PROD_FLOOR", "Result", "adamw_step", "axpby_reference", "clip_scale", "cross_entropy_forward_backward",
    "dropout_scales", "embedding_backward", "embedding_forward", "embedding_keep_mask", "gemm", "grad_norm",
    "gru_layer_backward", "gru_layer_forward", "gru_step_backward", "gru_sweep_backward", "gru_weight_grads",
    "head_backward", "head_forward", "hidden_keep_mask", "model_forward_backward", "nadam_coefficients", "nadam_step",
    "ngram_banned", "reference_apply_step", "reference_train_step", "residual_rmsnorm_backward",
    "residual_rmsnorm_forward", "sample_choice", "scheduled_sampling_inputs", "spectral_project",
    "spectral_project_model", "tf_select", "force_saves", "whole_dgh",
]
