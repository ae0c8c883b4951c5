"""The modules a Sentence-Transformers model runs on the pooled row (Dense, LayerNorm, Normalize), as torch.

Each is built as sentence-transformers builds it, with its weights from its folder (`model.safetensors`,
else `pytorch_model.bin`), and the chain runs in the engine on a batch's pooled rows, on the model's
device, in float32 (the pooled rows are float32: engine_core/runner.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import nn

from engine_core.st_modules import DenseHead, Head, LayerNormHead, MetadataError, NormalizeHead


class Dense(nn.Module):
    """sentence-transformers' Dense: activation(linear(x)), plus x or a bias-free projection of it."""

    def __init__(self, head: DenseHead):
        super().__init__()
        self.linear = nn.Linear(head.in_features, head.out_features, bias=head.bias)
        self.activation_function = activation_module(head.activation)
        self.use_residual = head.use_residual
        self.residual = (
            nn.Linear(head.in_features, head.out_features, bias=False)
            if head.use_residual and head.in_features != head.out_features
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.activation_function(self.linear(x))
        if self.use_residual:
            out = out + (x if self.residual is None else self.residual(x))
        return out


class LayerNorm(nn.Module):
    def __init__(self, head: LayerNormHead):
        super().__init__()
        self.norm = nn.LayerNorm(head.dimension)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(x)
        return out


class Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x, p=2, dim=-1)


def activation_module(path: str) -> nn.Module:
    """The activation a Dense config names by import path: torch.nn module classes only, built with no
    arguments, as sentence-transformers builds them (it imports other paths only with trust_remote_code,
    and without falls back to Tanh: poolserve refuses them instead)."""
    module_name, _, class_name = path.rpartition(".")
    activation = None
    if module_name == "torch.nn" or module_name.startswith("torch.nn."):
        try:
            activation = getattr(importlib.import_module(module_name), class_name, None)
        except ImportError:
            activation = None
    if not (isinstance(activation, type) and issubclass(activation, nn.Module)):
        raise MetadataError(f"the Dense activation {path!r} is not a torch.nn module, the only kind poolserve runs")
    return activation()


def read_module_state(folder: Path) -> dict[str, torch.Tensor]:
    """A module's weights as sentence-transformers' load_torch_weights reads them: model.safetensors, else
    pytorch_model.bin (tensors only)."""
    safetensors_path = folder / "model.safetensors"
    if safetensors_path.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors_path))
    bin_path = folder / "pytorch_model.bin"
    if not bin_path.is_file():
        raise MetadataError(f"{folder} holds no model.safetensors or pytorch_model.bin")
    state: dict[str, torch.Tensor] = torch.load(bin_path, map_location="cpu", weights_only=True)
    return state


def load_module_weights(module: nn.Module, folder: Path) -> None:
    state = read_module_state(folder)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise MetadataError(
            f"the weights in {folder} do not fit the module: missing {missing}, unexpected {unexpected}"
        )


def build_head_module(head: Head) -> nn.Module:
    if isinstance(head, NormalizeHead):
        return Normalize()
    module: nn.Module = Dense(head) if isinstance(head, DenseHead) else LayerNorm(head)
    load_module_weights(module, head.folder)
    return module


def build_heads(heads: tuple[Head, ...], device: torch.device) -> nn.Module | None:
    """The chain of heads, in float32 on `device`, ready to run; None when there are none."""
    if not heads:
        return None
    return nn.Sequential(*(build_head_module(head) for head in heads)).to(device=device, dtype=torch.float32).eval()
