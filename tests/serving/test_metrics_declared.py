"""Every metric the handler emits is declared in metrics.yaml (TorchServe drops undeclared ones)."""
from pathlib import Path

import yaml

from handler.serving.metrics import COUNTERS, GAUGES, HISTOGRAMS, LABELS

REPO = Path(__file__).resolve().parents[2]


def test_metrics_yaml_declares_every_handler_metric():
    declared = yaml.safe_load((REPO / "metrics.yaml").read_text())["model_metrics"]
    for kind, names in (("histogram", HISTOGRAMS), ("counter", COUNTERS), ("gauge", GAUGES)):
        entries = {m["name"]: m for m in declared[kind]}
        for name, unit in names.items():
            assert name in entries, f"{name} is not declared as a {kind} in metrics.yaml"
            assert entries[name]["unit"] == unit
            dims = entries[name]["dimensions"]
            assert dims[-2:] == ["ModelName", "Level"]
            assert (dims[0] == LABELS[name]) if name in LABELS else len(dims) == 2
