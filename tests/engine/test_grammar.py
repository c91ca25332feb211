"""JSON-schema grammars (llguidance) on the default model's tokenizer, without a model: any
logits, once masked, can only spell JSON that validates."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from handler.engine.grammar import ANY_OBJECT, GrammarError, Grammars, schema_text
from handler.engine.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
VOCAB = 49152


@pytest.fixture(scope="module")
def tokenizer(default_checkpoint) -> Tokenizer:
    return Tokenizer.from_dir(default_checkpoint)


@pytest.fixture(scope="module")
def grammars(tokenizer) -> Grammars:
    return Grammars(tokenizer.backend.to_str(), VOCAB, tokenizer.eos_ids)


def _spell(grammars: Grammars, tokenizer: Tokenizer, schema: str, seed: int, limit: int = 200) -> str:
    """Random logits, masked, argmax'd until the grammar is complete: what the worst model says."""
    gen = torch.Generator().manual_seed(seed)
    matcher, ids = grammars.matcher(schema), []
    while not matcher.complete:
        assert len(ids) < limit, tokenizer.decode(ids)
        logits = torch.randn(VOCAB, generator=gen)
        matcher.mask_logits(logits)
        token = int(logits.argmax())
        matcher.accept(token)
        ids.append(token)
    return tokenizer.decode(ids)


@pytest.mark.parametrize("seed", range(5))
def test_masked_random_logits_spell_valid_json(grammars, tokenizer, seed):
    text = _spell(grammars, tokenizer, schema_text(SCHEMA), seed)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_spells_an_object(grammars, tokenizer):
    assert isinstance(json.loads(_spell(grammars, tokenizer, ANY_OBJECT, 0, limit=2000)), dict)


def test_the_mask_leaves_allowed_logits_as_they_are(grammars):
    logits = torch.randn(VOCAB)
    masked = logits.clone()
    grammars.matcher(schema_text(SCHEMA)).mask_logits(masked)
    kept = masked != float("-inf")
    assert 0 < int(kept.sum()) < VOCAB and torch.equal(masked[kept], logits[kept])


def test_an_invalid_schema_says_why(grammars):
    with pytest.raises(GrammarError, match="invalid JSON schema"):
        grammars.grammar(schema_text({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}))


def test_schema_text_is_compact_and_keeps_the_schemas_order():
    assert schema_text({"b": 1, "a": [1, 2]}) == '{"b":1,"a":[1,2]}'
