"""Hot reload of the configuration (issue 15 item 7): on SIGHUP and when the config
file (or the `auth.api_keys_file`) changes, read it again and switch the live
settings at once, keeping every connection.

Owns:
- the decision table of what a reload may change (`reload_kind`, one test per row
  in tests/server/test_reload.py): live are `auth.api_keys` (and the
  `api_keys_file` they come from), `admin.keys`, `server.strict_queues`, every
  `[limits]` key but `max_message_bytes`, and the `[[queues]]` definitions (added,
  removed, retuned) except a queue's `dedup_window_ms`; everything else is
  restart-only (the listen addresses, data_dir, TLS paths, max_message_bytes,
  `[storage]`, `[logging]`, the other `[server]` keys). sepp-semantics.md,
  "Hot reload";
- `plan_reload(running, loaded)`: the configuration to run (the loaded live
  values, the running restart-only ones), the names of what changed, and the
  restart-only settings that differ; it raises ConfigError naming the key when the
  result is invalid (a live value may contradict a kept restart-only one:
  `max_payload_bytes` above the running `max_message_bytes`);
- `ConfigReloader`: loads (the file, then the environment and the command line
  again, exactly as at start: `load`), plans, applies (`apply`: the service's
  `reconfigure`), and logs one line per outcome -- INFO `config reloaded (...)`
  naming what changed (names, never a key or secret), one WARNING naming the
  restart-only settings that differ, or one ERROR naming the key of an invalid
  file, whose configuration is then not used at all. It polls the watched files'
  (mtime, size, inode) every 250 ms and reloads 500 ms after the last change
  seen, so an editor's several writes make one reload.

Promises: a reload runs on the event-loop thread in a callback of its own, so it
happens between two commands and every command decides under one configuration;
nothing of it is logged to the WAL (replay reads only which queues are declared,
sepp.core.config, and a restart reads the file anyway). Config-file queues keep
their precedence under runtime definitions (README, "Queues changed at runtime"):
a reload replaces the file's layer only.

Must not import: a front end (sepp.admin, the native protocol).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sepp.core.config import ConfigError, validate_config
from sepp.server.config import ServerConfig, is_loopback_host

log = logging.getLogger("sepp.reload")

# How often the watched files are checked, and how long after the last change a
# reload waits (sepp-semantics.md: change events debounced over 500 ms).
WATCH_INTERVAL_MS = 250
DEBOUNCE_MS = 500

LIVE = "live"
RESTART_ONLY = "restart_only"

# Settings outside [limits] that a reload switches (sepp-semantics.md, hot-reload
# table); api_keys_file is where auth.api_keys come from, so it is live with them.
LIVE_SETTINGS = frozenset(
    {
        ("auth", "api_keys"),
        ("auth", "api_keys_file"),
        ("admin", "keys"),
        ("server", "strict_queues"),
    }
)
# [limits] keys that bound what is already in flight: the frame size of every open
# connection (and the answer sizes computed from it).
RESTART_ONLY_LIMITS = frozenset({"max_message_bytes"})
# Per-queue keys of [[queues]] a reload keeps: the dedup window of idempotency
# keys already stored.
RESTART_ONLY_QUEUE_KEYS = frozenset({"dedup_window_ms"})


def reload_kind(section: str, key: str) -> str:
    """LIVE or RESTART_ONLY for the setting `section.key` (queues: section
    "queues", key the per-queue setting, "" for the definition itself)."""
    if section == "queues":
        return RESTART_ONLY if key in RESTART_ONLY_QUEUE_KEYS else LIVE
    if (section, key) in LIVE_SETTINGS:
        return LIVE
    if section == "limits" and key not in RESTART_ONLY_LIMITS:
        return LIVE
    return RESTART_ONLY


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload does: run `config`; `changed` names the live settings that
    change, `restart_only` those that differ in the file but keep their running
    value until a restart."""

    config: ServerConfig
    changed: tuple[str, ...]
    restart_only: tuple[str, ...]


_MISSING = object()


def plan_reload(running: ServerConfig, loaded: ServerConfig) -> ReloadPlan:
    """The configuration to switch to from `running`, given the freshly `loaded`
    one. Raises ConfigError (naming the key) when the result is invalid."""
    values = {section: dict(keys) for section, keys in running.values.items()}
    changed: list[str] = []
    restart_only: list[str] = []
    for section, keys in loaded.values.items():
        for key, value in keys.items():
            if running.values.get(section, {}).get(key, _MISSING) == value:
                continue
            name = f"{section}.{key}"
            if reload_kind(section, key) == LIVE:
                values[section][key] = value
                changed.append(name)
            else:
                restart_only.append(name)
    old_queues = {q["name"]: q for q in running.queues}
    queues: list[dict[str, Any]] = []
    for entry in loaded.queues:
        name = entry["name"]
        previous = old_queues.get(name)
        kept = {k: v for k, v in entry.items() if reload_kind("queues", k) == LIVE}
        for key in sorted(RESTART_ONLY_QUEUE_KEYS):
            before = None if previous is None else previous.get(key)
            if entry.get(key) != before:
                restart_only.append(f"queues.{name}.{key}")
            if before is not None:
                kept[key] = before
        queues.append(kept)
        if previous is None:
            changed.append(f"queues.{name} (added)")
        elif _live_part(previous) != _live_part(kept):
            changed.append(f"queues.{name}")
    loaded_names = {q["name"] for q in loaded.queues}
    changed.extend(f"queues.{name} (removed)" for name in old_queues if name not in loaded_names)
    # [[schedules]] are live (issue 17): the service puts each again (an unchanged
    # one logs nothing and keeps its anchor) and deletes the ones removed.
    if loaded.schedules != running.schedules:
        changed.append("schedules")
    config = ServerConfig(values, queues, running.source, loaded.schedules)
    _validate(config)
    return ReloadPlan(config, tuple(changed), tuple(restart_only))


def _live_part(queue: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in queue.items() if reload_kind("queues", k) == LIVE}


def _validate(config: ServerConfig) -> None:
    """The checks between settings that a reload can break: the live values
    against the restart-only ones kept (load_config checked each file alone)."""
    admin = config.admin_listen
    if (
        admin is not None
        and not is_loopback_host(admin[0])
        and not config.values["admin"].get("keys")
    ):
        raise ConfigError(
            "admin.keys",
            f"the admin listener on {admin[0]} is not on loopback and needs admin keys",
        )
    validate_config(config.core_config())


# -- the reloader ------------------------------------------------------------------------


def _signature(path: str) -> tuple[int, int, int] | None:
    """What tells a changed file: (mtime_ns, size, inode); None when missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ConfigReloader:
    """Reloads on `request` (SIGHUP) and when a watched file changes. Runs on the
    event-loop thread: `load` reads the files (small; a stat and a read), `apply`
    switches the running configuration synchronously."""

    def __init__(
        self,
        running: ServerConfig,
        load: Callable[[], ServerConfig],
        apply: Callable[[ServerConfig], None],
        *,
        watch_interval_ms: int = WATCH_INTERVAL_MS,
        debounce_ms: int = DEBOUNCE_MS,
    ) -> None:
        self.running = running
        self._load = load
        self._apply = apply
        self.watch_interval_s = watch_interval_ms / 1000
        self.debounce_s = debounce_ms / 1000
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poll_timer: asyncio.TimerHandle | None = None
        self._debounce_timer: asyncio.TimerHandle | None = None
        self._seen: dict[str, tuple[int, int, int] | None] = {}
        self.reloads = 0  # successful reloads (tests and the benchmark read it)
        self.stopped = False

    def watched_paths(self) -> list[str]:
        """The config file and the API keys file of the running configuration."""
        paths = [self.running.source, self.running.get("auth", "api_keys_file")]
        return [p for p in paths if p]

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start watching the files (from their state now)."""
        self._loop = loop
        self._remember()
        self._poll_timer = loop.call_later(self.watch_interval_s, self._poll)

    def stop(self) -> None:
        self.stopped = True
        for timer in (self._poll_timer, self._debounce_timer):
            if timer is not None:
                timer.cancel()
        self._poll_timer = self._debounce_timer = None

    def _remember(self) -> None:
        self._seen = {path: _signature(path) for path in self.watched_paths()}

    def _poll(self) -> None:
        if self.stopped or self._loop is None:
            return
        now = {path: _signature(path) for path in self._seen}
        if now != self._seen:
            self._seen = now
            # Debounce: a reload DEBOUNCE_MS after the last change seen.
            if self._debounce_timer is not None:
                self._debounce_timer.cancel()
            self._debounce_timer = self._loop.call_later(
                self.debounce_s, self.reload, "file change"
            )
        self._poll_timer = self._loop.call_later(self.watch_interval_s, self._poll)

    def reload(self, trigger: str = "SIGHUP") -> bool:
        """Read the configuration again and switch to it; True when it did. An
        invalid one changes nothing (one ERROR line naming the key)."""
        if self.stopped:
            return False
        if self._debounce_timer is not None:
            # This reload reads whatever a pending file change wrote.
            self._debounce_timer.cancel()
            self._debounce_timer = None
        # What the files are as read now: a later poll reloads only on a newer change.
        self._remember()
        try:
            plan = plan_reload(self.running, self._load())
            # Checks what only the running server knows (the runtime queue
            # definitions) before it changes anything: all or nothing.
            self._apply(plan.config)
        except ConfigError as exc:
            log.error(
                "config reload (%s) failed, the running configuration stays: %s", trigger, exc
            )
            return False
        self.running = plan.config
        self.reloads += 1
        self._remember()  # the API keys file may have moved
        log.info(
            "config reloaded (%s): %s",
            trigger,
            "changed " + ", ".join(plan.changed) if plan.changed else "no live setting changed",
        )
        if plan.restart_only:
            log.warning(
                "config reload (%s): restart-only settings changed and keep their running "
                "value until a restart: %s",
                trigger,
                ", ".join(plan.restart_only),
            )
        return True
