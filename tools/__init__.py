"""tools: `sepp-log`, the operator commands over a sepp data directory.

Owns: verify, dump, replay (point-in-time, optionally into a new data directory),
audit, stats and repair -- a thin front end over `log_format`, `sepp.core` and
`sepp.storage`. Entry point: `tools.sepp_log:main` from the repository root;
installed, the folder is the package `sepp_tools` (pyproject's package-dir: a
distribution must not claim the global name `tools`), so `sepp-log` is
`sepp_tools.sepp_log:main` and the modules here import each other relatively.

Promises: every command is read-only over the data directory it is given, except
`repair`, which changes it only when asked to, and keeps a backup of everything it
removes. A live data directory (a running server) can be read: the growing tail of
the last segment is never an error.

Must not import: `sepp.server`, `sepp.client` (ARCHITECTURE.md's layer table;
tests/test_layering.py enforces it).
"""
