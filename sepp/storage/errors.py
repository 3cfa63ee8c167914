"""Exceptions of `sepp.storage` that compiled modules raise.

Owns: `ReplayError`.

Why apart: the optional compiled build (mypyc, README "Compiled build") compiles
`sepp.storage.replay`, and mypyc cannot compile a class that inherits from a
built-in exception other than `Exception`; this module is never compiled.
`sepp.storage.replay` re-exports the class under its old name.

Must not import: anything.
"""

from __future__ import annotations


class ReplayError(ValueError):
    """A checksummed record that cannot be replayed."""
