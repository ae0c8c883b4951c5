"""Several models behind one server: the repeated --model values, or the --config file's [[models]] tables,
each made into one model's Config.

Every model's Config holds the same server-wide settings (the command line's); only the per-model ones
(Flag.is_per_model) differ, so each engine is handed its own model's Config unchanged and loads it as a
one-model server would.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from poolserve.config import Config, ConfigError, Flag

# The table of a --config file that lists the models.
MODELS_TABLE = "models"
# Model flags that say how the models are declared, not what one model is: a table may not set them.
DECLARATION_FIELDS = ("config", "default_model")


def per_model_fields() -> dict[str, Any]:
    """Config's per-model fields, by name, with their types (a --config table may set these)."""
    fields = {}
    for field in msgspec.structs.fields(Config):
        flags = [meta for meta in getattr(field.type, "__metadata__", ()) if isinstance(meta, Flag)]
        if flags and flags[0].is_per_model and field.name not in DECLARATION_FIELDS:
            fields[field.name] = field.type
    return fields


def split_model_value(value: str) -> tuple[str, str]:
    """A --model value as (name, path): NAME=PATH, else ("", PATH). A folder that exists is a path even with
    an `=` in its name, so a one-model command line that worked before means what it meant."""
    if "=" not in value or os.path.exists(value):
        return "", value
    name, path = value.split("=", 1)
    if not name.strip():
        raise ConfigError(f"--model has value {value!r}; the name before '=' is empty (give NAME=PATH).")
    return name, path


def model_configs(values: Mapping[str, Any]) -> list[Config]:
    """The Config of each model a command line declares, the default first. `values`: every Config field's value
    from the flags, `model` as the list of --model values given (None or empty: none given)."""
    given: list[str] = list(values["model"] or [])
    shared = {name: value for name, value in values.items() if name != "model"}
    if shared["config"]:
        if given:
            raise ConfigError("--model and --config both declare models; give the models in one of the two.")
        tables = read_models_file(shared["config"])
    else:
        tables = []
        for value in given or [""]:
            name, path = split_model_value(value)
            tables.append({"model": path, **({"served_model_name": [name]} if name else {})})
        if shared["served_model_name"] and (len(tables) > 1 or "served_model_name" in tables[0]):
            raise ConfigError(
                "--served-model-name names the one model of --model PATH; with NAME=PATH, or several --model, "
                "give each model its name as NAME=PATH (or use --config)."
            )
    configs = [Config(**{**shared, **table}) for table in tables]
    check_names_unique(configs)
    return put_default_first(configs, shared["default_model"])


def put_default_first(configs: list[Config], name: str) -> list[Config]:
    """The models with the one --default-model names first (every process takes the first as the default); the
    others in the order declared. No name: as declared."""
    if not name:
        return configs
    for number, config in enumerate(configs):
        if name in config.model_names:
            return [config, *configs[:number], *configs[number + 1 :]]
    served = ", ".join(repr(served) for config in configs for served in config.model_names)
    raise ConfigError(f"--default-model has value {name!r}, which names no model served; the names are {served}.")


def read_models_file(path: str) -> list[dict[str, Any]]:
    """The [[models]] tables of a TOML file, each checked against the per-model fields' types."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"--config has value {path!r}, which cannot be read: {exc.strerror or exc}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML: {exc}.") from None
    unknown = sorted(set(document) - {MODELS_TABLE})
    if unknown:
        raise ConfigError(f"--config {path}: unknown key {unknown[0]!r}; the file holds [[{MODELS_TABLE}]] tables.")
    tables = document.get(MODELS_TABLE)
    if not isinstance(tables, list) or not tables or not all(isinstance(table, dict) for table in tables):
        raise ConfigError(f"--config {path}: give at least one [[{MODELS_TABLE}]] table.")
    fields = per_model_fields()
    checked = []
    for number, table in enumerate(tables, 1):
        where = f"--config {path}, model {number}"
        for key in table:
            if key not in fields:
                raise ConfigError(
                    f"{where}: {key!r} is not a per-model setting; these are: {', '.join(sorted(fields))}."
                )
        try:
            checked.append({key: msgspec.convert(value, fields[key]) for key, value in table.items()})
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{where}: {exc}.") from None
    return checked


def check_names_unique(configs: Sequence[Config]) -> None:
    """A name picks one model: two models may not answer to the same one."""
    owner: dict[str, int] = {}
    for number, config in enumerate(configs, 1):
        for name in config.model_names:
            if name in owner and owner[name] != number:
                raise ConfigError(
                    f"models {owner[name]} and {number} are both named {name!r}; give each its own name "
                    "(NAME=PATH, or served_model_name in --config)."
                )
            owner[name] = number
