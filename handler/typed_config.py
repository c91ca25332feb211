"""A frozen dataclass's fields as the schema of a config mapping (YAML) and of CLI flags.

`parse(cls, values, origin, section)` rejects unknown keys (naming them, the section and the
allowed keys), checks each value against its field's type and builds the dataclass. Types:
str, int, float, bool, Path, `Literal[...]`, enums, `tuple[X, ...]`, `X | None` and nested
dataclasses (a nested mapping). A bool is never taken for an int (YAML `true` where a number
belongs is a typo). With `strings=True` text is converted as well ("8", "true", "aws,gcp"; an
empty string unsets an `X | None`): what command-line flags deliver.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A configuration is invalid; the message names the key and what to change."""


def parse(cls: type[T], values: Mapping[str, object], origin: str, section: str = "", *,
          strings: bool = False) -> T:
    """The dataclass `cls` from `values`; ConfigError for an unknown key or a wrong type.
    `origin` (a file, "flags") and `section` (a dotted path inside it) only name the place."""
    return cls(**typed_values(cls, values, origin, section, strings=strings))


def typed_values(cls: type, values: Mapping[str, object], origin: str, section: str = "", *,
                 strings: bool = False) -> dict[str, Any]:
    """What `parse` passes to `cls`, for callers that complete it first."""
    check_keys(values, field_names(cls), origin, section)
    hints = typing.get_type_hints(cls)
    return {name: convert(value, hints[name], _path(section, name), origin, strings=strings)
            for name, value in values.items()}


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def check_keys(values: Mapping[str, object], allowed: Iterable[str], origin: str,
               section: str = "") -> None:
    allowed = sorted(allowed)
    unknown = sorted(set(values) - set(allowed), key=str)
    if unknown:
        more = f" (and {unknown[1:]})" if unknown[1:] else ""
        where = f" in {section}" if section else ""
        raise ConfigError(f"{origin}: unknown key {unknown[0]!r}{more}{where}; "
                          f"allowed keys: {', '.join(allowed)}")


def convert(value: object, kind: Any, path: str, origin: str, *, strings: bool = False) -> Any:
    """`value` as `kind`, or a ConfigError saying what `path` must be."""
    wanted = kind
    if _is_optional(kind):
        if value is None or (strings and value == ""):
            return None
        kind = _without_none(kind)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if isinstance(value, kind):
            return value
        if not isinstance(value, Mapping):
            raise _wrong(value, wanted, path, origin)
        return parse(kind, value, origin, path, strings=strings)
    if typing.get_origin(kind) is tuple:
        return _convert_tuple(value, kind, path, origin, strings)
    try:
        return _convert_scalar(value, kind, strings)
    except (TypeError, ValueError):
        raise _wrong(value, wanted, path, origin) from None


def _convert_tuple(value: object, kind: Any, path: str, origin: str, strings: bool) -> tuple:
    item_kind = typing.get_args(kind)[0]
    if strings and isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)):
        raise _wrong(value, kind, path, origin)
    if strings:  # "aws, gcp," from a flag: spaces and empty items are not values
        value = [item for item in (i.strip() if isinstance(i, str) else i for i in value) if item != ""]
    return tuple(convert(item, item_kind, f"{path}[{i}]", origin, strings=strings)
                 for i, item in enumerate(value))


def _convert_scalar(value: object, kind: Any, strings: bool) -> object:
    """Raises TypeError or ValueError when `value` is not a `kind`."""
    if typing.get_origin(kind) is Literal:
        if value not in typing.get_args(kind):
            raise ValueError(value)
        return value
    if kind is bool:
        return _as_bool(value) if strings else _exactly(value, bool)
    if isinstance(value, bool):  # bool is an int to Python, never to a config
        raise TypeError(value)
    if strings and isinstance(value, str) and kind is not str:
        return kind(value)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(value)
    if kind is float:
        return float(_exactly(value, (int, float)))
    if kind is Path:
        if not isinstance(value, (str, Path)):
            raise TypeError(value)
        return Path(value)
    if kind is str and strings:
        return str(value)
    return _exactly(value, kind)


def _exactly(value: object, kind: type[T] | tuple[type[T], ...]) -> T:
    if not isinstance(value, kind):
        raise TypeError(value)
    return value


def _as_bool(value: object) -> bool:
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(value)


def _wrong(value: object, kind: Any, path: str, origin: str) -> ConfigError:
    return ConfigError(f"{origin}: {path} must be {describe(kind)}, got {value!r}")


def describe(kind: Any) -> str:
    """A type as an error message names it: "an integer", "one of 'a', 'b'"."""
    if _is_optional(kind):
        return f"{describe(_without_none(kind))} or null"
    if typing.get_origin(kind) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(kind))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in kind)
    if typing.get_origin(kind) is tuple:
        return f"a list of {describe(typing.get_args(kind)[0])} values"
    if dataclasses.is_dataclass(kind):
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))


def choices(cls: type, name: str) -> tuple:
    """The choices of a `Literal` field."""
    return typing.get_args(typing.get_type_hints(cls)[name])


# ---- command-line flags -------------------------------------------------------------------

def flag(cls: type, name: str) -> dict[str, Any]:
    """argparse keywords for a flag that sets the field `name`: its default, and its choices
    (a Literal) or its type (int, float), so the flag cannot drift from the field."""
    kind = typing.get_type_hints(cls)[name]
    default = _default(next(f for f in dataclasses.fields(cls) if f.name == name))
    if typing.get_origin(kind) is Literal:
        return {"default": default, "choices": list(choices(cls, name))}
    return {"default": default, "type": kind} if kind in (int, float) else {"default": default}


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One `--field-name` flag per field, help from the field's metadata["help"]; a flag that is
    not given reads None, so `flag_values` leaves it out and the file or the default applies."""
    for spec in dataclasses.fields(cls):
        parser.add_argument("--" + spec.name.replace("_", "-"), dest=spec.name, default=None,
                            help=f"{spec.metadata.get('help', '')} (default: {show(_default(spec))})")


def flag_values(args: argparse.Namespace, cls: type) -> dict[str, object]:
    """The flags of `add_arguments` that were given, by field name (text, for strings=True)."""
    return {name: value for name in field_names(cls) if (value := getattr(args, name, None)) is not None}


def show(default: object) -> str:
    if isinstance(default, tuple):
        return ",".join(show(item) for item in default)
    return str(default.value) if isinstance(default, enum.Enum) else str(default)


# ---- helpers --------------------------------------------------------------------------------

def _default(spec: dataclasses.Field) -> object:
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def _path(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def _is_optional(kind: Any) -> bool:
    return typing.get_origin(kind) in (types.UnionType, typing.Union) and type(None) in typing.get_args(kind)


def _without_none(kind: Any) -> Any:
    rest = [k for k in typing.get_args(kind) if k is not type(None)]
    if len(rest) != 1:
        raise TypeError(f"unsupported config type {kind}: only X | None unions")
    return rest[0]
