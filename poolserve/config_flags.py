"""Config's fields as command-line flags: argparse options made from their types and Flag metadata, and their
values read back (the environment too, for flags that have a variable). `launch` and `launch run-batch` share
them."""

from __future__ import annotations

import argparse
import os
import typing
from typing import Any, NamedTuple

import msgspec

from poolserve.config import Config, ConfigError, Flag
from poolserve.served_models import model_configs

# The flag that, repeated, declares another model.
MODEL_FIELD = "model"


class FlagField(NamedTuple):
    """A Config field seen as a flag: its name, its type without the Flag, the Flag, and its default."""

    name: str
    type: Any
    flag: Flag
    default: Any

    @property
    def option(self) -> str:
        return "--" + (self.flag.repeated_as or self.name).replace("_", "-")


def flag_fields() -> list[FlagField]:
    """Config's fields in order, each with the Flag it must carry."""
    fields = []
    for field in msgspec.structs.fields(Config):
        flags = [meta for meta in getattr(field.type, "__metadata__", ()) if isinstance(meta, Flag)]
        if len(flags) != 1:
            raise TypeError(f"Config.{field.name} needs one Flag in its Annotated type to be a `launch` flag")
        default = field.default if field.default_factory is msgspec.NODEFAULT else field.default_factory()
        fields.append(FlagField(field.name, typing.get_args(field.type)[0], flags[0], default))
    return fields


def add_flag(group: argparse._ArgumentGroup, field: FlagField) -> None:
    """One argparse option from the field's type: a bool is a switch, a list takes one or more
    values (or one per repeated flag), a Literal gives the choices; anything else is converted by its type."""
    options: dict[str, Any] = {"help": field.flag.help.replace("%", "%%"), "default": field.default}
    if field.flag.metavar:
        options["metavar"] = field.flag.metavar
    if field.flag.env:
        options["default"] = argparse.SUPPRESS  # the environment's value is read after parsing
    if field.name == MODEL_FIELD:
        # Repeated, it declares several models (poolserve/served_models.py); the values come back as a list.
        options["action"], options["default"] = "append", None
    elif field.type is bool:
        if field.default is not False:
            raise TypeError(f"{field.option} is a switch, so Config.{field.name} must default to False")
        options["action"] = "store_true"
    elif typing.get_origin(field.type) is list:
        options["type"] = typing.get_args(field.type)[0]
        if field.flag.repeated_as:
            options["action"], options["dest"] = "append", field.name
        else:
            options["nargs"] = "+"
    elif typing.get_origin(field.type) is typing.Literal:
        options["choices"] = typing.get_args(field.type)
    else:
        options["type"] = field.type
    group.add_argument(field.option, **options)


def flag_value(args: argparse.Namespace, field: FlagField) -> Any:
    """The flag's value, else (for a flag with an environment variable) the variable's, else the
    default: the one place the environment is read for a setting."""
    if not field.flag.env:
        return getattr(args, field.name)
    given, source = (getattr(args, field.name), field.option) if hasattr(args, field.name) else (None, "")
    if given is None and field.flag.env in os.environ:
        given, source = os.environ[field.flag.env], field.flag.env
    if given == "":
        if not field.flag.is_secret:
            # OpenTelemetry's rule for its variables: an empty one reads as unset.
            return field.default
        # A secret (the API key) that is empty went missing on its way (an unset template variable), and serving
        # without it would open the server.
        raise ConfigError(
            f"{source} is set but empty; give a value, or leave {field.option} and {field.flag.env} out entirely "
            "to run without one."
        )
    if given is None:
        return field.default
    return given if source != field.flag.env else from_environment(field, given)


def from_environment(field: FlagField, text: str) -> Any:
    """A variable's text as the field's type, as argparse would convert the flag's; ConfigError names the variable."""
    choices = typing.get_args(field.type) if typing.get_origin(field.type) is typing.Literal else None
    if choices is not None:
        if text not in choices:
            raise ConfigError(f"{field.flag.env} has value {text!r}; it must be one of {', '.join(choices)}.")
        return text
    try:
        return field.type(text)
    except ValueError:
        raise ConfigError(f"{field.flag.env} has value {text!r}; not a valid {field.type.__name__}.") from None


def configs_of(args: argparse.Namespace, fields: list[FlagField]) -> list[Config]:
    """Each declared model's Config from the parsed flags, the default model first."""
    return model_configs({field.name: flag_value(args, field) for field in fields})
