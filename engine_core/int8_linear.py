"""`--dtype int8` on a CPU: an encoder's linear layers computed in int8 by oneDNN's fused int8 product, each output
channel of the weights scaled on its own, the input as a whole after SmoothQuant's balancing of its channels.

Why this scheme (docs/benchmarks.md, "The fast mode (`--dtype int8`)"): torch's dynamic quantization (one scale per
batch for the activations) moved the bundled MiniLM's vectors to cosine 0.876 of sentence-transformers' (0.955 with
per-channel weights, 0.986 with the full 8 bits, 0.994 after balancing), short of the 0.995 a fast mode must keep:
the feed-forward down projections (a layer wider in than out, whose input is the activation function's output) carry
the error: a few of their input channels reach values several times the rest's, and a quantiser of its own around
them cost as much as int8 saved. So in a BERT-family feed-forward block (`Int8FeedForward`) the intermediate product's
own int8 op writes the GELU's output as uint8 at a step fixed from the probe set's range, and the down projection
takes that as its int8 input, with the channels of the largest values kept out in the model's dtype: the lowest
cosine is 0.9953 ("!!!", the hardest of tests/sentences.py; 0.9970 on 256 bench corpus sentences in any batching)
against 0.9969 and 0.9977 with the down projections out of int8, and a batch's pass takes 0.90-0.96 of the time.
Attention, the norms and the residual adds run in bfloat16 where the CPU has it natively (as `--dtype auto` would),
else float32, and so does every layer for an input of few tokens (one sentence; on several threads a few), where
quantising costs more than int8 saves. The int8 op applies the bias and a BERT intermediate block's GELU: the
quantisation around a bare int32 product (per-token scales, `torch._int_mm`) cost as much as the product saved. A
layer's query, key and value quantise their input once. The input channels' maxima are measured on the probe set
(engine_core/cpu_precision.py) while its float32 reference is computed; the quantized model must then agree with that
reference before it serves.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from transformers.activations import GELUActivation
from transformers.models.bert.modeling_bert import BertIntermediate, BertLayer, BertOutput

from engine_core.cpu_precision import MIN_TOP_OVERLAP, TOP_K, Agreement
from engine_core.fused_layers import output_with_add, same_code
from engine_core.packed_linear import PackedLinear

# The bound int8 must meet on the probe set: closer than ONNX Runtime's int8 MiniLM (cosine 0.987) by issue 33's rule.
MIN_COSINE_INT8 = 0.995
# SmoothQuant's migration strength: how much of an input channel's range moves into the weights.
BALANCE = 0.5
TINY = 1e-5
# The input's values are spread over 0..254 (not 255): rounding the largest then stays within uint8.
LEVELS = 254
# An input of fewer rows (tokens) runs in the layer's own dtype: at one short sentence quantising costs more than the
# int8 product saves (bench/int8_trial.py: 16 rows, 0.11 against 0.06 ms for 384 -> 384; even at 32 rows for 1536).
# On several threads the quantiser's small steps divide worse than the product: the bundled model on two threads,
# one input, ran 32 rows in 6.14 ms against 5.14 in bf16, 64 in 7.66 against 7.28, and 144 rows (6 inputs) in 11.52
# against 12.25 (docs/benchmarks.md, "The fast mode at one client").
MIN_INT8_ROWS = 32
MIN_INT8_ROWS_THREADED = 128
# The down projections' int8 input (Int8FeedForward): the exact GELU's least value, below 0 (-0.16997); how many input
# channels, the largest on the probe set, stay out of int8; how far above the probe set's largest value the rest may
# go before they saturate.
GELU_FLOOR = 0.17
OUTLIERS = 16
HEADROOM = 1.25


# A weight's int8 levels either side of 0. Without VNNI (AVX2, AVX512 before Cascade Lake) oneDNN multiplies uint8 by
# int8 with an instruction that sums each pair of products in 16 bits and saturates there: 2 x 255 x 127 = 64,770
# overflows 32,767, and the bundled model's probe cosine fell to 0.9885 (ONEDNN_MAX_CPU_ISA=AVX2 on an AVX512-VNNI
# host). With weights of 7 bits a pair stays within it (2 x 255 x 63 = 32,130): probe cosine 0.9967 there.
WEIGHT_LEVELS = 127
WEIGHT_LEVELS_SATURATING = 63


@functools.cache
def products_saturate() -> bool:
    """Whether oneDNN's int8 product on this CPU saturates pairs of uint8 x int8 products (no VNNI), measured rather
    than read from the CPU's flags: one product of all 255s by all 127s against its exact sum, which float32 holds
    exactly (384 x 255 x 127 < 2^24)."""
    rows, width = 128, 384
    values = torch.full((rows, width), 255, dtype=torch.uint8)
    weight = torch.ops.onednn.qlinear_prepack(torch.full((width, width), 127, dtype=torch.int8), None)
    ones, zeros = torch.ones(width), torch.zeros(width)
    out = torch.ops.onednn.qlinear_pointwise(
        values, 1.0, 0, weight, ones, zeros.long(), zeros, 1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip
    return bool((out != width * 255 * 127).any())


def weight_levels() -> int:
    return WEIGHT_LEVELS_SATURATING if products_saturate() else WEIGHT_LEVELS


def min_int8_rows() -> int:
    """The fewest rows an int8 layer computes in int8 on this thread's torch threads (engine_core/threads.py)."""
    return MIN_INT8_ROWS if torch.get_num_threads() == 1 else MIN_INT8_ROWS_THREADED


def padded_rows(rows: int) -> int:
    """`rows` rounded up to one of 8 sizes per doubling (at most 1/8 more rows): oneDNN builds a kernel for each
    row count it sees, ~10 ms each (docs/benchmarks.md), and keeps 1024; packed batches have any number of tokens."""
    step = max(1, (1 << (rows.bit_length() - 1)) // 8)
    return -(-rows // step) * step


@dataclass
class Quantized:
    """A layer input in uint8, its rows padded (`padded_rows`): value = step * (quantized - zero)."""

    values: torch.Tensor
    rows: int
    step: float
    zero: int


class InputQuantizer:
    """Quantizes an input to uint8 after dividing each channel by its balance, one scale and zero point for the whole
    tensor; once for every layer fed the same tensor (a BERT layer's query, key and value)."""

    def __init__(self, input_balance: torch.Tensor):
        self.input_balance = input_balance
        self.last: tuple[weakref.ref[torch.Tensor], int | None, Quantized] | None = None

    def __call__(self, x: torch.Tensor) -> Quantized:
        # An inference tensor has no version counter; the engine's passes change no layer input in place.
        version = None if x.is_inference() else x._version
        if self.last is not None and self.last[0]() is x and self.last[1] == version:
            return self.last[2]
        rows = x.reshape(-1, self.input_balance.shape[0]) * self.input_balance  # a new float32 tensor
        low, high = torch.aminmax(rows)
        low_, high_ = min(float(low), 0.0), max(float(high), 0.0)  # the range holds 0: the zero point is a uint8
        step = max(high_ - low_, 1e-12) / LEVELS
        zero = round(-low_ / step)
        values = torch.empty(padded_rows(len(rows)), rows.shape[1], dtype=torch.uint8)
        # + 0.5 then truncation (the cast) rounds: every value is >= -0.5 + 0.5 after the shift.
        values[: len(rows)].copy_(rows.mul_(1 / step).add_(zero + 0.5))
        quantized = Quantized(values, len(rows), step, zero)
        self.last = (weakref.ref(x), version, quantized)
        return quantized


def per_row_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight in int8 (`weight_levels()` either side of 0), packed for oneDNN, with a scale per output channel
    (row); and the zero points."""
    scale = weight.abs().amax(1).clamp(min=1e-12) / weight_levels()
    quantized = torch.round(weight / scale[:, None]).to(torch.int8)
    return torch.ops.onednn.qlinear_prepack(quantized, None), scale, torch.zeros(len(weight), dtype=torch.long)


class Int8Linear(torch.nn.Module):
    """A linear layer in int8 through oneDNN's fused int8 product (the op inductor's x86 quantizer emits): weights per
    output channel, the input per tensor (`InputQuantizer`), the bias and optionally GELU applied in the same op,
    the output in the input's dtype. An input of fewer rows than `min_int8_rows()` runs through the layer as it was."""

    def __init__(
        self, linear: torch.nn.Linear, quantizer: InputQuantizer, balance: torch.Tensor, *, is_gelu: bool = False
    ):
        super().__init__()
        self.balance = balance  # Int8FeedForward quantizes an intermediate layer's weights again, outlier rows aside
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.quantizer = quantizer
        self.post_op = "gelu" if is_gelu else "none"
        self.native = linear
        self.packed_weight: torch.Tensor
        self.weight_scale: torch.Tensor
        self.weight_zero: torch.Tensor
        self.bias: torch.Tensor
        packed, scale, zero = per_row_int8(linear.weight.detach().float() * balance)
        self.register_buffer("packed_weight", packed)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("weight_zero", zero)
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(linear.out_features)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < min_int8_rows() * self.in_features:
            out: torch.Tensor = self.native(x)
            return F.gelu(out) if self.post_op == "gelu" else out
        q = self.quantizer(x)
        out = torch.ops.onednn.qlinear_pointwise(
            q.values, q.step, q.zero, self.packed_weight, self.weight_scale, self.weight_zero, self.bias,
            1.0, 0, x.dtype, self.post_op, [], "none" if self.post_op == "gelu" else "",
        )  # fmt: skip
        return out[: q.rows].reshape(*x.shape[:-1], self.out_features)


class Int8FeedForward(torch.nn.Module):
    """A BERT feed-forward block (intermediate product, GELU, down projection, plus the block's input) in int8 where
    the down projection is too: its input, the GELU's output, is written as uint8 by the intermediate product's own
    oneDNN op at one step fixed from the probe set's range (`HEADROOM` above it), so nothing quantizes it on the way
    (the rows stay padded as the block's input was). A few channels reach values several times the rest's (one of
    1536 reaches 24.7 in the bundled model's first layer where the others stay under 6.4) and would take the step
    with them: the OUTLIERS largest stay out of int8, computed in the model's dtype beside it. An input of fewer rows
    than `min_int8_rows()` runs through the block's layers as they were. It takes the place of the block's
    `output.dense` (the intermediate becomes a pass-through): `plus(hidden, input)` is the block's output before its
    LayerNorm, `output.dense(intermediate(input)) + input`."""

    def __init__(self, up: Int8Linear, down: torch.nn.Linear, maxima: torch.Tensor):
        super().__init__()
        self.in_features = self.out_features = down.out_features  # the block's input and output (MiniLM: 384)
        self.native_up, self.native_down = up.native, down
        self.quantizer = up.quantizer
        up_weight = up.native.weight.detach().float() * up.balance
        up_bias = up.native.bias.detach().float() if up.native.bias is not None else torch.zeros(len(up_weight))
        down_weight = down.weight.detach().float()
        self.down_bias: torch.Tensor
        self.register_buffer(
            "down_bias", down.bias.detach().float() if down.bias is not None else torch.zeros(len(down_weight))
        )
        order = maxima.argsort(descending=True)
        kept_out = min(OUTLIERS, len(order) - 1)
        outliers, channels = order[:kept_out], order[kept_out:]
        self.step = (float(maxima[channels].max()) * HEADROOM + GELU_FLOOR) / LEVELS
        self.zero = round(GELU_FLOOR / self.step)
        self.up_weight: torch.Tensor
        self.up_scale: torch.Tensor
        self.up_zero: torch.Tensor
        self.up_bias: torch.Tensor
        self.down_weight: torch.Tensor
        self.down_scale: torch.Tensor
        self.down_zero: torch.Tensor
        for name, value in zip(
            ("up_weight", "up_scale", "up_zero", "down_weight", "down_scale", "down_zero"),
            (*per_row_int8(up_weight[channels]), *per_row_int8(down_weight[:, channels])),
            strict=True,
        ):
            self.register_buffer(name, value)
        self.register_buffer("up_bias", up_bias[channels])
        # the outliers' side: GELU(input @ their intermediate rows + their bias) @ their down columns, + the input
        self.side_up: PackedLinear | None = None
        self.side_down: PackedLinear | None = None
        if len(outliers):
            dtype = down.weight.dtype
            side_up = torch.nn.Linear(self.in_features, len(outliers), dtype=dtype)
            side_down = torch.nn.Linear(len(outliers), self.in_features, bias=False, dtype=dtype)
            with torch.no_grad():
                side_up.weight.copy_(up.native.weight[outliers])
                side_up.bias.copy_(up_bias[outliers])
                side_down.weight.copy_(down_weight[:, outliers])
            self.side_up, self.side_down = PackedLinear(side_up), PackedLinear(side_down)
            self.side_up.post = "gelu"

    def plus(self, hidden: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The block's output before its LayerNorm; `hidden` is the pass-through intermediate's, `x` itself."""
        if x.numel() < min_int8_rows() * self.in_features:
            out: torch.Tensor = self.native_down(F.gelu(self.native_up(x)))
            return out + x
        q = self.quantizer(x)
        qlinear = torch.ops.onednn.qlinear_pointwise
        gelu = qlinear(
            q.values, q.step, q.zero, self.up_weight, self.up_scale, self.up_zero, self.up_bias,
            self.step, self.zero, None, "gelu", [], "none",
        )  # fmt: skip
        summed: torch.Tensor = qlinear(
            gelu, self.step, self.zero, self.down_weight, self.down_scale, self.down_zero, self.down_bias,
            1.0, 0, x.dtype, "none", [], "",
        )  # fmt: skip
        side = x if self.side_up is None or self.side_down is None else self.side_down.plus(self.side_up(x), x)
        return summed[: q.rows].reshape(x.shape).add_(side)


def quantize_feed_forwards(model: torch.nn.Module, record: InputRecord) -> int:
    """Replaces, in place, each BERT feed-forward block whose intermediate product is an Int8Linear with its GELU (after
    `quantize_linears`) by an Int8FeedForward; returns how many down projections went to int8. A block whose code
    is not BERT's is left as it is."""
    replaced = 0
    for name, layer in model.named_modules():
        intermediate, output = getattr(layer, "intermediate", None), getattr(layer, "output", None)
        if intermediate is None or output is None or "forward" in vars(output):
            continue
        if not (
            same_code(type(layer).feed_forward_chunk, BertLayer.feed_forward_chunk)
            and same_code(type(intermediate).forward, BertIntermediate.forward)
            and same_code(type(output).forward, BertOutput.forward)
        ):
            continue
        up, down = getattr(intermediate, "dense", None), getattr(output, "dense", None)
        maxima = record.maxima.get(f"{name}.output.dense" if name else "output.dense")
        if not isinstance(up, Int8Linear) or up.post_op != "gelu" or type(down) is not torch.nn.Linear:
            continue
        if maxima is None:
            continue
        output.dense = Int8FeedForward(up, down, maxima)
        output.forward = types.MethodType(output_with_add, output)  # LayerNorm(dense.plus(hidden, input))
        intermediate.dense = torch.nn.Identity()
        replaced += 1
    return replaced


@dataclass
class InputRecord:
    """What the probe fed each linear layer: each input channel's largest magnitude, and which layers were fed one
    tensor (they share a quantizer, hence a balance)."""

    maxima: dict[str, torch.Tensor] = field(default_factory=dict)
    shared: list[list[str]] = field(default_factory=list)


def record_inputs(
    model: torch.nn.Module, run: Callable[[], npt.NDArray[np.float32]]
) -> tuple[npt.NDArray[np.float32], InputRecord]:
    """What `run` returns, and what each linear layer it ran was fed (layers it did not run, such as an unused
    pooler, are absent)."""
    record = InputRecord()
    fed: dict[int, list[str]] = {}
    alive: list[torch.Tensor] = []  # held while recording, so that no two inputs have one id

    def recorder(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def record_input(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            x = inputs[0].detach()
            seen = x.reshape(-1, x.shape[-1]).abs().amax(0).float()
            maxima = record.maxima
            maxima[name] = torch.maximum(maxima[name], seen) if name in maxima else seen
            alive.append(inputs[0])
            names = fed.setdefault(id(inputs[0]), [])
            if name not in names:
                names.append(name)

        return record_input

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
    grouped: dict[str, list[str]] = {}
    for names in fed.values():
        group = next((grouped[name] for name in names if name in grouped), [])
        for name in names:
            if name not in grouped:
                group.append(name)
                grouped[name] = group
    record.shared = [group for group in {id(g): g for g in grouped.values()}.values()]
    return reference, record


def takes_int8(linear: torch.nn.Linear) -> bool:
    """Whether a layer runs in int8 on its own: not a down projection (more inputs than outputs), whose input needs the
    scheme of `Int8FeedForward`."""
    return linear.in_features <= linear.out_features


def fuses_gelu(parent: torch.nn.Module, child_name: str) -> bool:
    """Whether `parent` is a BERT-style intermediate block (`dense`, then exact GELU), whose GELU the int8 op can
    apply."""
    act = getattr(parent, "intermediate_act_fn", None)
    return child_name == "dense" and isinstance(act, GELUActivation) and act.act is F.gelu


def quantize_linears(model: torch.nn.Module, record: InputRecord) -> int:
    """Replaces, in place, each linear layer that `record` measured and that takes int8 by an Int8Linear; returns
    how many."""
    modules = dict(model.named_modules())
    replaced = 0
    for group in record.shared:
        linears = [modules[name] for name in group]
        if not all(isinstance(linear, torch.nn.Linear) and takes_int8(linear) for linear in linears):
            continue
        weights = torch.cat([linear.weight.detach().float() for linear in linears])
        balance = record.maxima[group[0]].clamp(min=TINY).pow(BALANCE)
        balance = (balance / weights.abs().amax(0).clamp(min=TINY).pow(1 - BALANCE)).clamp(min=TINY)
        quantizer = InputQuantizer(1 / balance)
        for name, linear in zip(group, linears, strict=True):
            parent_name, _, child_name = name.rpartition(".")
            parent = modules[parent_name]
            is_gelu = fuses_gelu(parent, child_name)
            setattr(parent, child_name, Int8Linear(linear, quantizer, balance, is_gelu=is_gelu))
            if is_gelu:
                parent.intermediate_act_fn = torch.nn.Identity()
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
