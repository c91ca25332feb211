"""Benchmarks and drills, run from the repository root as modules: `python -m bench.<name>`
(`python -m bench.chaos` for the chaos run in bench/chaos/). Each writes docs/results/ and its
section of docs/benchmarks.md; none is part of the product.
"""
