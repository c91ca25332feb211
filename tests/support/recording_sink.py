"""A metric sink that keeps every observation, for tests (handler.serving.metrics.MetricSink)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RecordingSink:
    values: list[tuple[str, float, str | None]] = field(default_factory=list)

    def observe(self, name: str, value: float, label: str | None = None) -> None:
        self.values.append((name, value, label))

    def flush(self) -> None:
        pass  # holds nothing back

    def of(self, name: str) -> list[float]:
        return [v for n, v, _ in self.values if n == name]
