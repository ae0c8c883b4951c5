"""A folder's own model code (config.json's `auto_map`, run with --trust-remote-code): whether it may run, and
whether it can be found where the folder says it is."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub import try_to_load_from_cache
from transformers import PretrainedConfig

from engine_core.folder_choices import LoadError, first_line


def own_code_of(model_config: object, auto: str) -> Any:
    """What config.json's `auto_map` names for the Auto class `auto` (the folder's own "module.Class"), if anything."""
    return (getattr(model_config, "auto_map", None) or {}).get(auto)


def check_own_code(model_config: PretrainedConfig, auto: str, trust: bool) -> None:
    """A folder that names its own modeling code for the class poolserve loads (gte-Qwen2's bidirectional
    Qwen2, NomicBert, JinaBert) runs that code or is refused: without --trust-remote-code, transformers
    would quietly load its built-in class of the same model type, which is not the model its authors ran."""
    own = own_code_of(model_config, auto)
    if own and not trust:
        raise untrusted(auto, own)


def untrusted(auto: str, own: str) -> LoadError:
    return LoadError(f"the folder's config runs its own code for {auto} ({own}); give --trust-remote-code to run it.")


def read_auto_map(folder: Path) -> dict[str, object]:
    try:
        auto_map = json.loads((folder / "config.json").read_text()).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return {}
    return auto_map if isinstance(auto_map, dict) else {}


def untrusted_config(folder: Path) -> LoadError | None:
    """Why a folder whose configuration is its own code (a model_type transformers does not know: GTE-new's `new`)
    could not load without --trust-remote-code, said as check_own_code says it, not as transformers does."""
    own = read_auto_map(folder).get("AutoConfig")
    return untrusted("AutoConfig", own) if isinstance(own, str) else None


def check_weights_found(model_config: PretrainedConfig, auto: str, missing: Iterable[str]) -> None:
    """The folder's own code on a checkpoint that lacks some of the weights it builds would run those as they were
    initialised (random) and answer plausible vectors: refused. A pooler's are left out: BERT-like code builds one
    whose output poolserve never reads (it pools the token states), and checkpoints trained without it omit it."""
    own = own_code_of(model_config, auto)
    absent = sorted(name for name in missing if ".pooler." not in f".{name}")
    if own and absent:
        shown = ", ".join(absent[:3]) + (", ..." if len(absent) > 3 else "")
        raise LoadError(
            f"the folder's own code ({own}) finds no weights in the checkpoint for {len(absent)} of its parameters "
            f"({shown}), which would run random: the code and the checkpoint do not match."
        )


def check_first_pass(model_config: PretrainedConfig, auto: str, run: Callable[[], object]) -> None:
    """The folder's own code run once before anything else: code written for an older transformers often loads and
    then fails on its first pass (a helper it calls was removed), which would otherwise surface as a bare traceback."""
    own = own_code_of(model_config, auto)
    if not own:
        return
    try:
        run()
    except Exception as exc:
        raise LoadError(
            f"the folder's own code ({own}) fails on its first forward pass ({type(exc).__name__}: {first_line(exc)}): "
            f"it may be written for another transformers release than the one installed ({transformers.__version__})."
        ) from exc


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built here put their parameters on the meta device (no memory, no initialisation work) and their
    buffers where they are computed, as accelerate's `init_empty_weights(include_buffers=False)` does."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, parameter: torch.nn.Parameter | None) -> None:
        register(module, name, parameter)
        if parameter is not None:
            module._parameters[name] = torch.nn.Parameter(parameter.to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def restore_computed_buffers(model: torch.nn.Module, auto: str) -> list[str]:
    """The buffers the folder's own code computes when it builds the model (ALiBi slopes, rotary frequencies,
    position ids: `register_buffer(..., persistent=False)`), as that code computes them. They are not in the
    checkpoint, and transformers 5 builds a model on the meta device and materialises what the checkpoint lacks
    as uninitialised memory unless the model's `_init_weights` sets it, which code written for transformers 4 (as
    jina-bert-implementation's and nomic's) does not: served so, every vector would be wrong without a word. The
    model is built once more with its parameters on the meta device, and each such buffer that differs is taken
    from there (cast to the loaded one's dtype and device). Returns the names restored."""
    own = own_code_of(model.config, auto)
    persistent = set(model.state_dict())
    computed = [name for name, _ in model.named_buffers() if name not in persistent]
    if not own or not computed:
        return []
    try:
        with parameters_on_meta():
            built = dict(type(model)(model.config).named_buffers())
    except Exception as exc:
        raise LoadError(
            f"the folder's own code ({own}) computes buffers when it builds the model ({', '.join(computed[:3])}), "
            f"which transformers {transformers.__version__} leaves uninitialised on loading, and building it again "
            f"to compute them failed ({type(exc).__name__}: {first_line(exc)})."
        ) from exc
    restored = []
    for name in computed:
        loaded = model.get_buffer(name)
        fresh = built.get(name)
        if fresh is None or fresh.is_meta:
            continue
        fresh = fresh.to(device=loaded.device, dtype=loaded.dtype if loaded.is_floating_point() else fresh.dtype)
        if fresh.shape != loaded.shape or not torch.equal(fresh, loaded):
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner).register_buffer(leaf, fresh, persistent=False)
            restored.append(name)
    return restored


def follow_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The model in the dtype asked for, where its own from_pretrained ignored it (nomic's reads only the older
    `torch_dtype`): no floating weight in that dtype means none was loaded so. A model with some in it is left as
    loaded (transformers keeps a model's `_keep_in_fp32_modules` in float32 on purpose)."""
    floating = [parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()]
    if floating and dtype not in floating:
        return model.to(dtype)
    return model


def code_of_other_repositories(folder: Path) -> dict[str, dict[str, str]]:
    """The code config.json's auto_map takes from other repositories than the folder ("org/repo--module.Class",
    as nomic-embed-text, gte-*-v1.5 and jina-embeddings-v2 ship), by repository: each Auto class's reference
    within that repository."""
    references: dict[str, dict[str, str]] = {}
    for auto, value in read_auto_map(folder).items():
        # AutoTokenizer's value is a pair: the slow class and the fast one (either may be null).
        for reference in value if isinstance(value, list) else [value]:
            if isinstance(reference, str) and "--" in reference:
                repository, local = reference.split("--", 1)
                references.setdefault(repository, {})[auto] = local
    return references


def uncached_code(folder: Path) -> dict[str, dict[str, str]]:
    """The other repositories' code that is not in the Hugging Face cache (transformers looks for it there, never
    in the folder, and fetches it from the hub where one is reachable)."""
    missing = {}
    for repository, references in code_of_other_repositories(folder).items():
        files = {local.rsplit(".", 1)[0] + ".py" for local in references.values()}
        if not all(isinstance(try_to_load_from_cache(repository, file), str) for file in files):
            missing[repository] = references
    return missing


def code_not_found(folder: Path) -> LoadError | None:
    """Why a folder that runs another repository's code could not load, where that code is nowhere to be had: one
    sentence naming the repository, its files, and how to serve the folder without a hub."""
    missing = uncached_code(folder)
    if not missing:
        return None
    repository, references = next(iter(missing.items()))
    files = sorted({local.rsplit(".", 1)[0] + ".py" for local in references.values()})
    auto = "AutoModel" if "AutoModel" in references else next(iter(references))
    example = f'"{auto}": "{references[auto]}"'
    return LoadError(
        f"config.json's auto_map runs code from the repository {repository} ({', '.join(files)}), which is neither "
        "in the folder nor in the Hugging Face cache, and could not be fetched from a hub: copy those files into the "
        f"folder and name them there without the repository ({example}), or fetch {repository} once where a hub is "
        "reachable."
    )
