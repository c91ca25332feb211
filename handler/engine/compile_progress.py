"""What a cold compile tells the person waiting for it: which graph, how many are left, and
about how long, estimated from the graphs compiled so far (each takes minutes on 2 cores)."""
from __future__ import annotations

from dataclasses import dataclass, field

MARKER = "compiling graph"  # starts each progress line: serve.sh finds the latest in the worker log


@dataclass
class CompileProgress:
    expected: int  # graphs expected in all; the coverage loop (aot.py) may find it needs more
    seconds: list[float] = field(default_factory=list)  # what each compiled graph took
    # Graphs compiled side by side in processes of their own (handler.engine.parallel_compile):
    # the number of this process's first graph among all, and how many compile beside it.
    first: int = 1
    beside: int = 0

    @property
    def total(self) -> int:
        return max(self.expected, self.first + len(self.seconds))

    def starting(self, what: str) -> str:
        """The line logged as this process's next graph starts compiling."""
        n = self.first + len(self.seconds)
        if self.beside:
            return (f"{MARKER} {n} of {self.total} ({what}), side by side with {self.beside} more in processes "
                    f"of their own; they finish about together")
        if not self.seconds:
            return f"{MARKER} {n} of {self.total} ({what}); a time estimate follows the first graph"
        left = sum(self.seconds) / len(self.seconds) * (self.total - n + 1)
        return f"{MARKER} {n} of {self.total} ({what}); about {_duration(left)} left"

    def finished(self, seconds: float) -> None:
        self.seconds.append(seconds)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
