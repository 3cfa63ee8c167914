"""Which asyncio event loop the server runs on (`server.event_loop`).

Owns: `EVENT_LOOPS`, `resolve_event_loop(setting)`, `run_on(loop_name, main)` and
`loop_kind(loop)`.

Promises: `auto` (the default) runs on uvloop when it is installed (the `uvloop`
extra: `pip install 'sepp[uvloop]'`) and on the standard loop otherwise; `asyncio`
always runs the standard loop; `uvloop` without uvloop installed is a
configuration error at startup, never a silent fallback. The server's code is the
same on both loops (it uses only the public asyncio API).

Why uvloop is worth offering: at the 50/50 headline load the server is CPU-bound
on one core, and a sixth of that time is the standard loop's own Python
(`_run_once`, the selector transport's read and write paths, thread-safe
wake-ups); uvloop runs those in C. Measured in benchmarks/README.md
(optimisation log, finding 10).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sepp.core.errors import ConfigError

EVENT_LOOPS = ("auto", "asyncio", "uvloop")

T = TypeVar("T")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve_event_loop(setting: str) -> str:
    """The loop `setting` means here: "asyncio" or "uvloop"."""
    if setting == "auto":
        return "uvloop" if uvloop_installed() else "asyncio"
    if setting == "uvloop" and not uvloop_installed():
        raise ConfigError(
            "server.event_loop",
            "uvloop is not installed (pip install 'sepp[uvloop]', or set it to auto or asyncio)",
        )
    if setting not in EVENT_LOOPS:
        raise ConfigError("server.event_loop", f"must be one of {', '.join(EVENT_LOOPS)}")
    return setting


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """ "uvloop" or "asyncio": what the server reports it runs on."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run_on(loop_name: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` to completion on a new event loop of the named kind."""
    if loop_name == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main())
    return asyncio.run(main())
