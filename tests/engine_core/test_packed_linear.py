"""engine_core/packed_linear.py: linear layers with their weights packed once answer as `torch.nn.Linear` does,
tied weights are left alone, and packing is undone where the model's answers move or a layer cannot run packed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine_core.packed_linear import PackedLinear, pack_linears, plain_linears, release_file_pages
from tests.engine_core.cpu_support import BF16_PACKS, NO_BF16_PACKING


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not BF16_PACKS, reason=NO_BF16_PACKING))],
)
@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_layer_answers_as_the_plain_one_at_any_row_count(dtype: torch.dtype, bias: bool) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias).to(dtype)
    packed = PackedLinear(linear)
    for shape in [(1, 48), (7, 48), (3, 5, 48), (600, 48)]:
        x = torch.randn(shape, dtype=dtype)
        with torch.inference_mode():
            want, got = linear(x), packed(x)
        assert got.shape == want.shape and got.dtype == dtype
        torch.testing.assert_close(got, want, atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=1e-4)
    assert packed.weight.shape == linear.weight.shape and packed.weight.dtype == dtype and packed.weight.is_meta


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.hidden = torch.nn.Linear(8, 8)
        self.decoder = torch.nn.Linear(8, 10, bias=False)
        self.decoder.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.decoder(self.hidden(self.embed(ids)))
        return out


def test_a_layer_whose_weight_another_parameter_shares_stays_plain() -> None:
    model = Tied()
    assert [name for _, name, _ in plain_linears(model)] == ["hidden"]


def answers_of(model: torch.nn.Module) -> np.ndarray:
    with torch.inference_mode():
        return np.asarray(model(torch.arange(10)).float().numpy(), dtype=np.float32)


def test_packing_keeps_the_answers_and_counts_the_layers() -> None:
    torch.manual_seed(0)
    model = Tied().eval()
    before = answers_of(model)
    assert pack_linears(model, lambda: answers_of(model), before) == 1
    assert isinstance(model.hidden, PackedLinear) and type(model.decoder) is torch.nn.Linear
    np.testing.assert_allclose(answers_of(model), before, atol=1e-6)


class ReadsItsWeight(Tied):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed(ids) @ self.hidden.weight.T  # code of its own that uses a layer's values
        return out


def test_packing_is_undone_where_a_layer_is_read_directly() -> None:
    model = ReadsItsWeight().eval()
    before = answers_of(model)
    assert pack_linears(model, lambda: answers_of(model), before) == 0
    assert type(model.hidden) is torch.nn.Linear
    np.testing.assert_array_equal(answers_of(model), before)


def test_packing_is_undone_where_the_answers_move() -> None:
    model = Tied().eval()
    calls = iter([np.ones((2, 4), np.float32), np.array([[1, 0, 0, 0], [1, 1, 1, 1]], np.float32)])
    assert pack_linears(model, lambda: next(calls), next(calls)) == 0
    assert type(model.hidden) is torch.nn.Linear


def resident_kb(path: Path) -> int:
    """The resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0] and len(line.split()) >= 5:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_a_dropped_weight_s_pages_in_a_file_mapping_are_given_back_and_read_the_same(tmp_path: Path) -> None:
    values = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    path = tmp_path / "weights.bin"
    values.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="c")  # a private mapping, as safetensors' is
    weight = torch.from_numpy(mapped)
    assert float(weight.sum()) == pytest.approx(float(values.sum()), rel=1e-4)  # every page read in
    assert resident_kb(path) >= 4000
    release_file_pages([weight])
    assert resident_kb(path) < 100
    np.testing.assert_array_equal(weight.numpy(), values)  # read again from the file, unchanged


def test_a_weight_of_its_own_memory_is_left_to_be_freed() -> None:
    weight = torch.ones(1 << 20)
    release_file_pages([weight])
    assert float(weight.sum()) == 1 << 20


def test_packing_is_undone_where_onednn_refuses_a_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a CPU without AVX512, where oneDNN packs no bfloat16 weight: the model serves plain."""
    model = Tied().eval()
    before = answers_of(model)

    def refuse(weight: torch.Tensor, rows: int) -> torch.Tensor:
        raise RuntimeError("this CPU does not support bf16")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    assert pack_linears(model, lambda: answers_of(model), before) == 0
    assert type(model.hidden) is torch.nn.Linear
    np.testing.assert_array_equal(answers_of(model), before)
