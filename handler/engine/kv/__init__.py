"""The KV cache's bookkeeping: its pages (pages.py), the tokens each slot holds (prefix_cache.py),
and both together for the engine (slot_memory.py)."""
