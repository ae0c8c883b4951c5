"""Which GPU each engine gets: a pure function of the models' --device settings, their engine counts and the GPUs the
supervisor sees; the arbiter hands each engine its GPU as CUDA_VISIBLE_DEVICES and logs the plan's warnings."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from poolserve.boot import EngineLayout, child_name


class PlacementError(Exception):
    """A model names a GPU that is not there; the message is the one line `launch` prints."""


class PlacedModel(NamedTuple):
    """What placement needs of one model: its name, its --device's kind (auto, cpu, cuda) and the GPU indexes it
    names (cuda:I,J; empty: none named), and its engine count."""

    name: str
    device: str
    gpus: Sequence[int]
    engine_count: int


class Placement(NamedTuple):
    """`gpus`: each engine's CUDA_VISIBLE_DEVICES (engines numbered across the models, as EngineLayout numbers them),
    None where it is left as the supervisor's (a one-engine server, or an engine on the CPU); `warnings`: one line per
    GPU that holds more than one engine."""

    gpus: list[str | None]
    warnings: list[str]


def place_engines(models: Sequence[PlacedModel], visible: Sequence[str]) -> Placement:
    """A model that names GPUs (cuda:I,J: the I-th and J-th of `visible`) has its k-th engine on the (k mod n)-th of
    them. The other models' engines, CPU ones aside, go round the GPUs no model named (all of them when every GPU is
    named), in engine order; with no model naming one that is --engine-count's rule, engine i on GPU i mod the count.
    Engines sharing a GPU are allowed, each with a copy of its model, and warned about."""
    layout = EngineLayout([model.engine_count for model in models])
    named = {index for model in models for index in model.gpus}
    for model in models:
        for index in model.gpus:
            if index >= len(visible):
                seen = f"the {len(visible)} visible are {', '.join(visible)}" if visible else "no GPU is visible"
                raise PlacementError(
                    f"model {model.name!r} has --device cuda:{','.join(map(str, model.gpus))}, but there is no GPU "
                    f"{index}: {seen} (CUDA_VISIBLE_DEVICES, else the NVIDIA driver's list, numbered from 0)."
                )
    pool = [gpu for index, gpu in enumerate(visible) if index not in named] or list(visible)
    gpus: list[str | None] = []
    unnamed = 0
    for number, model in enumerate(models):
        for engine in layout.engines_of(number):
            local = layout.local_index(engine)
            if model.gpus:
                gpus.append(visible[model.gpus[local % len(model.gpus)]])
            elif model.device == "cpu" or layout.total == 1:
                gpus.append(None)
            elif pool:
                gpus.append(pool[unnamed % len(pool)])
                unnamed += 1
            else:
                # No GPU seen (no driver listing, no variable): engine i is told GPU i, which nothing reads on a
                # machine without one.
                gpus.append(str(engine))
    return Placement(gpus, shared_gpu_warnings(models, layout, gpus))


def shared_gpu_warnings(models: Sequence[PlacedModel], layout: EngineLayout, gpus: Sequence[str | None]) -> list[str]:
    """One line per GPU that more than one engine was placed on, naming the engines and their models."""
    holders: dict[str, list[str]] = defaultdict(list)
    for engine, gpu in enumerate(gpus):
        model = models[layout.model_of(engine)]
        if gpu is not None and model.device != "cpu":
            holders[gpu].append(f"{child_name('engine', engine, layout.total)} ({model.name!r})")
    return [
        f"GPU {gpu} holds {len(engines)} engines, {', '.join(engines)}: each a copy of its model, sharing the GPU's "
        "memory and compute"
        for gpu, engines in holders.items()
        if len(engines) > 1
    ]
