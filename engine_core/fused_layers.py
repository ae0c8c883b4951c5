"""A BERT-family layer's element-wise work done inside its packed linear layers' oneDNN calls, on a CPU.

Eager, a BERT layer runs its feed-forward GELU and its two residual adds as passes of their own over the states, each
a parallel region of its own on the engine's threads. With the weights packed (engine_core/packed_linear.py) oneDNN
applies them as the product is written, as torch's inductor does for a frozen CPU graph: the GELU on the
intermediate product (a post-op), the residual added to each output product before its LayerNorm (a binary
post-op). In float32 the answers were the same bits on the bundled MiniLM, and a batch took 0.85-0.98 of the
unfused time in-process (0.85 without padding, 0.94-0.98 for corpus sentences; served, within the noise:
docs/benchmarks.md, "GELU and residual adds inside the products").
Not in bfloat16: there oneDNN rounds the product-plus-input once where eager rounds the product and then the sum,
which moves the vectors ~4e-5 (1 - cos) from the plain bfloat16 model's (a little closer to float32's) for no gain
shown on this host; the start-up check would refuse it every time.

Modules are found by their code, not their class: a module whose `forward` is compiled from the same code as BERT's
intermediate (its `dense`, then its activation) with transformers' exact GELU, or as BERT's output (`dense`,
dropout, then the LayerNorm of the sum with the input), in any family that copies BERT's code (RoBERTa, XLM-R,
MPNet's feed-forward output, ELECTRA, ...). A model whose code differs keeps its eager steps. pack_weights
(engine_core/loader.py) holds the fused model to the plain one's answers and undoes the fusing where they move.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers.activations import GELUActivation
from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput

from engine_core.packed_linear import PackedLinear, why_moved

logger = logging.getLogger(__name__)


def same_code(method: Any, like: Any) -> bool:
    """Whether `method` is compiled from the same code as `like`: the same bytecode over the same names."""
    code, wanted = getattr(method, "__code__", None), like.__code__
    return code is not None and code.co_code == wanted.co_code and code.co_names == wanted.co_names


def is_exact_gelu(module: object) -> bool:
    return type(module) is GELUActivation and module.act is torch.nn.functional.gelu


def output_with_add(self: Any, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
    """BERT's output in eval: LayerNorm(dense(hidden) + input), the sum made by `dense.plus` (a PackedLinear's: by
    oneDNN with the product; engine_core/int8_linear.py's Int8FeedForward: the whole feed-forward block's)."""
    out: torch.Tensor = self.LayerNorm(self.dense.plus(hidden_states, input_tensor))
    return out


def fuse_layers(model: torch.nn.Module) -> list[Callable[[], None]]:
    """Fuse, in place, every GELU and residual add of `model` that fits (see above); the steps that undo each."""
    undo: list[Callable[[], None]] = []
    for module in model.modules():
        dense = getattr(module, "dense", None)
        if module.training or not isinstance(dense, PackedLinear) or dense.post != "none":
            continue
        if dense.weight.dtype != torch.float32:
            continue  # bfloat16: see the module's docstring
        forward = type(module).forward
        act = getattr(module, "intermediate_act_fn", None)
        if same_code(forward, BertIntermediate.forward) and isinstance(act, torch.nn.Module) and is_exact_gelu(act):
            dense.post = "gelu"
            module.intermediate_act_fn = torch.nn.Identity()
            undo.append(partial(unfuse_gelu, module, dense, act))
        elif (
            same_code(forward, BertOutput.forward)
            and isinstance(getattr(module, "dropout", None), torch.nn.Dropout)
            and "forward" not in vars(module)
        ):
            module.forward = types.MethodType(output_with_add, module)
            undo.append(partial(delattr, module, "forward"))
    return undo


def unfuse_gelu(module: torch.nn.Module, dense: PackedLinear, act: torch.nn.Module) -> None:
    dense.post = "none"
    module.intermediate_act_fn = act


def fuse_layers_checked(
    model: torch.nn.Module, run: Callable[[], npt.NDArray[np.float32]], before: npt.NDArray[np.float32]
) -> int:
    """Fuse where `run` (the model's answer to a few sentences) still agrees with `before`, the plain model's; the
    number of GELUs and adds fused (0 where it was undone, with a log line)."""
    undo = fuse_layers(model)
    if not undo:
        return 0
    reason = why_moved(run, before, "a fused layer")
    if reason is None:
        return len(undo)
    for step in undo:
        step()
    logger.warning("GELUs and residual adds left unfused: %s", reason)
    return 0
