"""Capacity planner: from the benchmark results to replicas, spot/on-demand mix and cost.

`model` is the pure arithmetic, `results` reads docs/results/*.json, `plot` draws the figure,
`cli` is the `ts-llm-plan` command. docs/capacity.md has a worked example.
"""
