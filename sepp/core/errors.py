"""The exceptions of `sepp.core`, in a module of their own.

Owns: `ConfigError`, `ApplyError`, `SnapshotContentError`, `InvariantViolation`.

Why apart: the optional compiled build (mypyc, see README "Compiled build")
compiles the modules that raise these, and mypyc cannot compile a class that
inherits from a built-in exception other than `Exception` itself; this module is
never compiled. The raising modules import the classes from here and re-export
them under their old names.

Must not import: anything.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is out of range or two settings contradict each other. `key`
    names the offending setting (for example `queues.emails.retry_delay_ms`)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class ApplyError(RuntimeError):
    """An event contradicts the state it is applied to: a bug or a corrupt log."""


class SnapshotContentError(ValueError):
    """Snapshot rows that cannot form a state (wrong shape or contradictory)."""


class InvariantViolation(AssertionError):
    """The state broke one of its own rules: a bug, never an input error."""
