"""The model: the decoder (transformer.py), its attention's parts (attention.py) and its projections
(linear.py, over packed.py's weight layouts)."""
