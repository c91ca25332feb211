"""Tokenizer and chat template of a checkpoint directory (tokenizers + a sandboxed Jinja2)."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from handler.engine import EngineError


class ChatTemplateError(EngineError, ValueError):
    pass


NO_CHAT_TEMPLATE = "this model has no chat template"  # how the 400 begins (serve.sh's demo reads it)


@dataclass
class Tokenizer:
    backend: HFTokenizer
    eos_ids: frozenset[int]
    chat_template: str | None
    special_tokens: dict[str, str]

    @classmethod
    def from_dir(cls, path: Path) -> Tokenizer:
        path = Path(path)
        backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
        tok_cfg = _read_json(path / "tokenizer_config.json")
        template = tok_cfg.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        specials = {k: _token_text(tok_cfg.get(k)) for k in ("bos_token", "eos_token") if tok_cfg.get(k)}
        return cls(backend, _eos_ids(path, backend, specials), template, specials)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    @functools.cached_property
    def _template(self) -> Template:
        # Compiled once, not per request: a chat template is parsed and compiled to Python.
        assert self.chat_template is not None, "render_chat checks it"
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson  # not Jinja's own, which escapes <, > and & for HTML
        env.globals["raise_exception"] = _raise
        return env.from_string(self.chat_template)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's text, as log-probabilities show it."""
        return self.decode([token_id])

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The model's chat template rendered as transformers renders it (a sandboxed Jinja with
        its `tojson` and `raise_exception`); a template that refuses the request says why."""
        if not self.chat_template:
            raise ChatTemplateError(f"{NO_CHAT_TEMPLATE}; send `prompt` instead of `messages`")
        try:
            return self._template.render(messages=messages, tools=tools, add_generation_prompt=True, **self.special_tokens)
        except TemplateError as err:
            raise ChatTemplateError(f"the model's chat template cannot render these messages: {err}") from err

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        # The template already writes the special tokens it wants.
        return self.encode(self.render_chat(messages, tools), add_special_tokens=False)


def _tojson(value, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str):
    raise TemplateError(message)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(value) -> str:
    return value["content"] if isinstance(value, dict) else str(value)


def _eos_ids(path: Path, backend: HFTokenizer, specials: dict[str, str]) -> frozenset[int]:
    ids: set[int] = set()
    for cfg in (_read_json(path / "config.json"), _read_json(path / "generation_config.json")):
        eos = cfg.get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if "eos_token" in specials and (tid := backend.token_to_id(specials["eos_token"])) is not None:
        ids.add(tid)
    return frozenset(ids)
