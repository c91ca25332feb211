"""handler.typed_config: a dataclass's fields as the schema of a mapping and of CLI flags."""
from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from handler.typed_config import ConfigError, add_arguments, flag, flag_values, parse


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Limits:
    size: int = 1


@dataclass(frozen=True)
class Settings:
    name: str = field(default="x", metadata={"help": "what it is called"})
    count: int = 2
    ratio: float = 0.5
    enabled: bool = False
    mode: Literal["fast", "slow"] = "fast"
    color: Color = Color.RED
    colors: tuple[Color, ...] = (Color.RED,)
    where: Path = Path(".")
    limit: int | None = None
    limits: Limits = field(default_factory=Limits)


def test_unknown_key_names_it_the_section_and_the_allowed_keys():
    with pytest.raises(ConfigError,
                       match=r"^app.yaml: unknown key 'cuont' in settings; allowed keys: color, colors, count"):
        parse(Settings, {"cuont": 3}, "app.yaml", "settings")


def test_wrong_type_names_the_key_and_what_it_must_be():
    with pytest.raises(ConfigError, match=r"^app.yaml: settings.count must be an integer, got '3'$"):
        parse(Settings, {"count": "3"}, "app.yaml", "settings")


def test_bool_is_not_taken_for_an_int():
    with pytest.raises(ConfigError, match="count must be an integer, got True"):
        parse(Settings, {"count": True}, "app.yaml")


def test_int_is_taken_for_a_float():
    assert parse(Settings, {"ratio": 1}, "app.yaml").ratio == 1.0


def test_none_is_allowed_only_where_the_type_says_so():
    assert parse(Settings, {"limit": None}, "app.yaml").limit is None
    with pytest.raises(ConfigError, match="count must be an integer, got None"):
        parse(Settings, {"count": None}, "app.yaml")


def test_literal_choice_is_checked():
    with pytest.raises(ConfigError, match="mode must be one of 'fast', 'slow', got 'medium'"):
        parse(Settings, {"mode": "medium"}, "app.yaml")


def test_enum_and_tuple_of_enums_are_built_from_their_values():
    settings = parse(Settings, {"color": "blue", "colors": ["blue", "red"]}, "app.yaml")
    assert settings.color is Color.BLUE and settings.colors == (Color.BLUE, Color.RED)


def test_a_bad_tuple_item_is_named_by_its_index():
    with pytest.raises(ConfigError, match=r"colors\[1\] must be one of 'red', 'blue', got 'green'"):
        parse(Settings, {"colors": ["red", "green"]}, "app.yaml")


def test_path_is_built_from_a_string():
    assert parse(Settings, {"where": "/tmp/x"}, "app.yaml").where == Path("/tmp/x")


def test_nested_section_is_parsed_with_its_path():
    assert parse(Settings, {"limits": {"size": 4}}, "app.yaml").limits == Limits(4)
    with pytest.raises(ConfigError, match=r"unknown key 'sise' in settings\.limits"):
        parse(Settings, {"limits": {"sise": 4}}, "app.yaml", "settings")


def test_strings_are_converted_only_when_asked():
    settings = parse(Settings, {"count": "3", "enabled": "yes", "colors": "blue, red,", "limit": ""}, "flags",
                     strings=True)
    assert (settings.count, settings.enabled, settings.limit) == (3, True, None)
    assert settings.colors == (Color.BLUE, Color.RED)


def test_a_string_that_is_not_a_boolean_is_refused():
    with pytest.raises(ConfigError, match="enabled must be true or false, got 'maybe'"):
        parse(Settings, {"enabled": "maybe"}, "flags", strings=True)


def test_cli_flags_come_from_the_fields_and_only_given_ones_count():
    parser = argparse.ArgumentParser()
    add_arguments(parser, Limits)
    assert flag_values(parser.parse_args(["--size", "7"]), Limits) == {"size": "7"}
    assert flag_values(parser.parse_args([]), Limits) == {}


def test_cli_flag_help_is_the_field_help_with_its_default():
    parser = argparse.ArgumentParser()
    add_arguments(parser, Settings)
    assert "what it is called (default: x)" in parser.format_help()
    assert "--colors" in parser.format_help() and "(default: red)" in parser.format_help()


def test_a_single_flag_takes_the_fields_default_and_choices():
    assert flag(Settings, "mode") == {"default": "fast", "choices": ["fast", "slow"]}
    assert flag(Settings, "count") == {"default": 2, "type": int}


def test_an_optional_field_says_null_is_allowed_too():
    with pytest.raises(ConfigError, match="limit must be an integer or null, got True"):
        parse(Settings, {"limit": True}, "app.yaml")
