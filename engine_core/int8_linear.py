"""`--dtype int8` on a CPU: an encoder's linear layers computed in int8, each token and each output channel scaled
on its own, after SmoothQuant's balancing of the layer's input channels against its weights.

Why this scheme (docs/benchmarks.md, "The fast mode (`--dtype int8`)"): torch's dynamic quantization (one scale per
batch for the activations) moved the bundled MiniLM's vectors to cosine 0.876 of sentence-transformers' (0.955 with
per-channel weights, 0.986 with the full 8 bits, 0.994 after balancing), short of the 0.995 a fast mode must keep.
One scale per token and balancing kept 0.995 on the bench corpus but 0.992 on "!!!": the feed-forward down
projections (a layer wider in than out, whose input is the activation function's output) carry the error, and kept
out of int8 the lowest cosine is 0.9985. They, attention, the norms and the activations run in bfloat16 where the
CPU has it natively (as `--dtype auto` would), else float32. The input channels' maxima are measured on the probe
set (engine_core/cpu_precision.py) while its float32 reference is computed; the quantized model must then agree
with that reference before it serves.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

from engine_core.cpu_precision import MIN_TOP_OVERLAP, TOP_K, Agreement

# The bound int8 must meet on the probe set: closer than ONNX Runtime's int8 MiniLM (cosine 0.987) by issue 33's rule.
MIN_COSINE_INT8 = 0.995
# SmoothQuant's migration strength: how much of an input channel's range moves into the weights.
BALANCE = 0.5
TINY = 1e-5


class Int8Linear(torch.nn.Module):
    """A linear layer in int8: weights per output channel, inputs per token (row), accumulated in int32."""

    def __init__(self, linear: torch.nn.Linear, input_max: torch.Tensor):
        super().__init__()
        weight = linear.weight.detach().float()
        balance = input_max.float().clamp(min=TINY).pow(BALANCE) / weight.abs().amax(0).clamp(min=TINY).pow(1 - BALANCE)
        balance = balance.clamp(min=TINY)
        balanced = weight * balance
        scale = balanced.abs().amax(1).clamp(min=1e-12) / 127
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight_t: torch.Tensor
        self.weight_scale: torch.Tensor
        self.input_balance: torch.Tensor
        self.bias: torch.Tensor
        self.register_buffer("weight_t", torch.round(balanced / scale[:, None]).to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("input_balance", 1 / balance)
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(linear.out_features)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Each step works in place on a tensor made here (the product with the float32 balance is a new float32
        # one): the quantisation around the int8 product is element-wise passes, which cost as much as it saves.
        rows = x.reshape(-1, self.in_features) * self.input_balance
        largest = torch.linalg.vector_norm(rows, ord=float("inf"), dim=1, keepdim=True).clamp_(min=1e-12)
        quantized = rows.mul_(127 / largest).round_().to(torch.int8)
        out = torch._int_mm(quantized, self.weight_t).float().mul_(largest / 127)
        out.mul_(self.weight_scale).add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def record_input_maxima(
    model: torch.nn.Module, run: Callable[[], npt.NDArray[np.float32]]
) -> tuple[npt.NDArray[np.float32], dict[str, torch.Tensor]]:
    """What `run` returns, and each linear layer's largest input magnitude per channel while it ran (layers it did
    not run, such as an unused pooler, are absent)."""
    maxima: dict[str, torch.Tensor] = {}

    def recorder(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def record(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            seen = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0).float()
            maxima[name] = torch.maximum(maxima[name], seen) if name in maxima else seen

        return record

    hooks = [
        module.register_forward_hook(recorder(name))
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    try:
        reference = run()
    finally:
        for hook in hooks:
            hook.remove()
    return reference, maxima


def takes_int8(linear: torch.nn.Linear) -> bool:
    """Whether a layer runs in int8: not a down projection (more inputs than outputs), whose error dominates."""
    return linear.in_features <= linear.out_features


def quantize_linears(model: torch.nn.Module, maxima: dict[str, torch.Tensor]) -> int:
    """Replaces, in place, each linear layer that `maxima` measured and that takes int8 by an Int8Linear; returns
    how many."""
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if isinstance(child, torch.nn.Linear) and name in maxima and takes_int8(child):
                setattr(parent, child_name, Int8Linear(child, maxima[name]))
                replaced += 1
    return replaced


def int8_refusal(measured: Agreement) -> str | None:
    """Why the int8 model may not serve, or None where it agrees with float32 closely enough."""
    if measured.min_cosine >= MIN_COSINE_INT8 and measured.top_overlap >= MIN_TOP_OVERLAP:
        return None
    return (
        f"--dtype int8 is refused for this model: in int8 its vectors stray from float32 on the probe set (min "
        f"cosine {measured.min_cosine:.4f}, top-{TOP_K} overlap {measured.top_overlap:.3f}; needs min cosine >= "
        f"{MIN_COSINE_INT8}, top-{TOP_K} overlap >= {MIN_TOP_OVERLAP}); serve it with --dtype auto or float32."
    )
