"""What a cold compile tells the person waiting for it: which graph, how many are left, and
about how long, estimated from the graphs compiled so far (each takes minutes on 2 cores)."""
from __future__ import annotations

from dataclasses import dataclass, field

MARKER = "compiling graph"  # starts each progress line: serve.sh finds the latest in the worker log


@dataclass
class CompileProgress:
    expected: int  # graphs expected in all; the coverage loop (aot.py) may find it needs more
    seconds: list[float] = field(default_factory=list)  # what each compiled graph took

    @property
    def total(self) -> int:
        return max(self.expected, len(self.seconds) + 1)

    def starting(self, what: str) -> str:
        """The line logged as graph number len(seconds)+1 starts compiling."""
        n = len(self.seconds) + 1
        if not self.seconds:
            return f"{MARKER} {n} of {self.total} ({what}); a time estimate follows the first graph"
        left = sum(self.seconds) / len(self.seconds) * (self.total - n + 1)
        return f"{MARKER} {n} of {self.total} ({what}); about {_duration(left)} left"

    def finished(self, seconds: float) -> None:
        self.seconds.append(seconds)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
