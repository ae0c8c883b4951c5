"""Linear layers on a CPU with their weights packed once, in oneDNN's layout, instead of at every call.

`F.linear` on a CPU hands a plain weight to oneDNN (bfloat16) or MKL (float32), which lay it out in their blocked
format again on every call: a cost of the weight's size, whatever the rows. For a lone sentence (16-30 rows)
that is most of the pass: the bundled MiniLM answered one 16-token sentence in 0.66-0.70 of the time with
every linear layer packed once (float32 and bfloat16 alike), and 32 sentences in 0.86-0.90 (docs/benchmarks.md,
"Weights packed once"). This is what torch's own inductor does for a frozen CPU graph
(`torch.ops.mkldnn._linear_pointwise` over a weight from `_reorder_linear_weight`), without compiling anything.

The numbers: in bfloat16 oneDNN runs the same kernel either way (the answers are the same bits); in float32 oneDNN's
product replaces MKL's, which rounds differently (~5e-7). Packing is checked at start-up on the warm-up sentences
(the vectors must agree to float32's rounding) and undone, with a log line, where they do not or where a layer of
the model cannot run packed.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

from engine_core.cpu_precision import unit_rows

logger = logging.getLogger(__name__)

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
MADV_DONTNEED = 4  # Linux's value on every architecture torch's CPU wheels are built for

# The rows oneDNN is told to expect: the layout it picks for 512 served 1 to 640 rows as fast as or faster than
# a plain weight (docs/benchmarks.md, "Weights packed once"); without a hint its choice lost at 32 rows in float32.
ROWS_HINT = 512
PACKED_DTYPES = (torch.float32, torch.bfloat16)
# Packed against plain on the same rows: float32's rounding of a different summation order, far below any
# cosine a test or a user would notice (1 - cos of 1e-6 is ~1e-12).
MIN_COSINE = 0.99999


class PackedLinear(torch.nn.Module):
    """`torch.nn.Linear`'s product with the weight held packed. `weight` stays as a meta tensor of the same shape and
    dtype, so code that reads a layer's dtype or shape (transformers' T5 does) still can; its values are gone."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.packed: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())
        self.weight = torch.empty(weight.shape, dtype=weight.dtype, device="meta")
        # An element-wise function oneDNN applies to the product as it writes it (engine_core/fused_layers.py):
        # "none", or "gelu" (the exact, erf GELU).
        self.post = "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        algorithm = "none" if self.post == "gelu" else ""  # oneDNN's name for the erf GELU
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, self.post, [], algorithm)
        return out.reshape(*x.shape[:-1], self.out_features)

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """`self(x) + other` in one oneDNN call: `other` added as the product is written."""
        rows = x.reshape(-1, self.in_features)
        added = other.reshape(-1, self.out_features)
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise.binary(rows, added, self.packed, self.bias, "add")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        post = f", post={self.post}" if self.post != "none" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{post}"


def can_pack(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]


def plain_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """Each plain linear layer (parent, attribute, layer) in a precision oneDNN packs whose weight no other
    parameter shares (a tied decoder would keep its embedding's copy and gain a second one)."""
    storages: dict[int, int] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        key = parameter.untyped_storage().data_ptr()
        storages[key] = storages.get(key, 0) + 1
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is not torch.nn.Linear or child.weight.dtype not in PACKED_DTYPES:
                continue
            if storages.get(child.weight.untyped_storage().data_ptr(), 0) > 1:
                continue
            found.append((parent, name, child))
    return found


def pack_linears(
    model: torch.nn.Module, run: Callable[[], npt.NDArray[np.float32]], before: npt.NDArray[np.float32]
) -> int:
    """Pack `model`'s linear layers in place where `run` (the model's answer to a few sentences) still agrees with
    `before` (its answer unpacked); the number packed (0 where it was undone)."""
    layers = plain_linears(model)
    if not layers:
        return 0
    try:
        # oneDNN may refuse a precision this CPU lacks (bfloat16 forced without AVX512)
        for parent, name, linear in layers:
            setattr(parent, name, PackedLinear(linear))
    except Exception as exc:
        reason: str | None = f"a packed layer failed ({type(exc).__name__}: {exc})"
    else:
        # or the model's own code may use a layer's weight itself
        reason = why_moved(run, before, "a packed layer")
    if reason is not None:
        for parent, name, linear in layers:
            setattr(parent, name, linear)
        logger.warning("linear weights left unpacked: %s", reason)
        return 0
    release_file_pages([linear.weight for _, _, linear in layers])
    return len(layers)


def why_moved(run: Callable[[], npt.NDArray[np.float32]], before: npt.NDArray[np.float32], changed: str) -> str | None:
    """None where `run`'s answer agrees with `before` to float32's rounding (MIN_COSINE); else why not. `changed`:
    what was changed, named where running it failed."""
    try:
        cosine = min_cosine(before, run())
    except Exception as exc:
        return f"{changed} failed ({type(exc).__name__}: {exc})"
    return None if cosine >= MIN_COSINE else f"its vectors moved (min cosine {cosine:.6f})"


def release_file_pages(weights: list[torch.Tensor]) -> None:
    """Give back the pages of weights no longer used that lie in a file mapping. transformers loads a safetensors
    checkpoint as views on one private mapping of the file, which stays mapped while any of its tensors lives (the
    embeddings do): without this the plain weights' pages would stay resident beside their packed copies (+42 MB
    for MiniLM in float32). Only whole pages inside a weight are dropped; a private file page dropped is read again
    from the file if ever touched, and no live tensor is in one."""
    mappings = file_mappings()
    page = mmap.PAGESIZE
    for weight in weights:
        start = weight.untyped_storage().data_ptr()
        end = start + weight.untyped_storage().nbytes()
        if not any(low <= start and end <= high for low, high in mappings):
            continue  # memory of its own: freed with the layer
        first, last = -(-start // page) * page, end // page * page
        if last > first:
            LIBC.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_DONTNEED)


def file_mappings() -> list[tuple[int, int]]:
    """This process's address ranges mapped from a file (/proc/self/maps' lines with a path)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/"):
                low, high = fields[0].split("-")
                ranges.append((int(low, 16), int(high, 16)))
    return ranges


def min_cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    """The lowest cosine between matching rows, a row the same in both counting 1 (a zero row has no direction)."""
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    cosines = np.sum(unit_rows(a) * unit_rows(b), axis=1)
    return float(np.min(np.where(np.all(a == b, axis=1), 1.0, cosines)))
