"""The model: its shape (args.py), the decoder (transformer.py), its attention's parts (attention.py,
rope.py) and its projections (linear.py, over packed.py's weight layouts)."""
