"""The serving benchmark's baseline: stock TorchServe with a plain transformers handler.

Eager `generate`, TorchServe's own batching (batchSize/maxBatchDelay), no streaming: what a team
gets from the TorchServe docs without this package. Not part of the product.
"""
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler


class TransformersHandler(BaseHandler):
    def initialize(self, context):
        model_dir = context.system_properties["model_dir"]
        cfg = context.model_yaml_config.get("handler", {})
        self.tokenizer = AutoTokenizer.from_pretrained(f"{model_dir}/checkpoint", padding_side="left")
        dtype = getattr(torch, cfg.get("dtype", "float32"))
        self.model = AutoModelForCausalLM.from_pretrained(f"{model_dir}/checkpoint", dtype=dtype).eval()
        self.initialized = True

    def handle(self, data, context):
        bodies = [json.loads(row.get("body") or row.get("data")) if isinstance(row.get("body") or row.get("data"), (bytes, str))
                  else (row.get("body") or row.get("data")) for row in data]
        prompts = [b["prompt"] for b in bodies]
        n = max(b.get("max_new_tokens", 32) for b in bodies)
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=self.tokenizer.eos_token_id)
        new = out[:, batch.input_ids.shape[1]:]
        return [json.dumps({"text": self.tokenizer.decode(row, skip_special_tokens=True),
                            "usage": {"prompt_tokens": int(m.sum()), "completion_tokens": int(row.numel())}})
                for row, m in zip(new, batch.attention_mask)]
