"""Server configuration: a TOML file, environment overrides, command-line flags.

Owns: the settings schema (sections, keys, types, defaults — the reference's names
where the feature is shared), loading with precedence *flags > environment > file >
defaults*, validation that names the offending key, conversion into the core's
`CoreConfig` and the storage's `StorageOptions`, and `example_config()` — a complete,
commented file equal to the defaults (`sepp config example`).

Config file path: `--config`, else `SEPP_CONFIG`, else `./sepp.toml` if present. An
explicit path that does not exist is an error. Environment: `SEPP_<SECTION>__<KEY>`
(double underscore), values parsed as TOML values when they parse, else as strings.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sepp.core.config import (
    POLICY_KEYS,
    ConfigError,
    CoreConfig,
    Limits,
    QueuePolicy,
    validate_config,
)
from sepp.core.schedules import CATCH_UP_DEFAULT, CATCH_UP_POLICIES, CronError, parse_cron
from sepp.server.admission import DESCRIPTORS_RESERVED_DEFAULT, STORAGE_DESCRIPTORS_PEAK
from sepp.server.allocator import ALLOCATORS
from sepp.server.loops import EVENT_LOOPS
from sepp.server.pipeline import SYNC_METHODS
from sepp.server.timezones import UnknownTimeZone, zone_table
from sepp.storage import PERSIST_MODES, StorageOptions

DEFAULT_LISTEN = "127.0.0.1:7463"
DEFAULT_ADMIN_LISTEN = "127.0.0.1:9465"
# [admin] listen_addr values that turn the admin listener off.
ADMIN_OFF = ("off",)
DEFAULT_DATA_DIR = "./sepp-data"
DEFAULT_CONFIG_FILE = "sepp.toml"
ENV_PREFIX = "SEPP_"
ENV_CONFIG = "SEPP_CONFIG"


@dataclass(frozen=True)
class ClusterSettings:
    """[cluster], checked (ServerConfig.cluster)."""

    nats_urls: list[str]
    monitor_urls: list[str]
    node_id: str
    advertise_addr: str
    lease_ttl_ms: int
    lease_renew_ms: int
    snapshot_every_messages: int = 10_000
    appends_in_flight: int = 4
    # The NATS connection's credentials and TLS (all optional; the secrets are
    # left out of repr, and never logged or shown by server_info).
    nats_user: str | None = None
    nats_password: str | None = field(default=None, repr=False)
    nats_token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None


@dataclass(frozen=True)
class Key:
    """One setting: its type, default and the comment `sepp config example` prints."""

    kind: str  # "int", "opt_int", "bool", "str", "str_list", "opt_str_list", "api_keys",
    # "admin_keys", "opt_str", "opt_rate_limit" (a { jobs, per_ms } table)
    default: Any
    doc: str
    minimum: int | None = None
    choices: tuple[str, ...] | None = None
    # Commented lines `sepp config example` prints after an unset key (its shape).
    example: tuple[str, ...] = ()


_LIMIT_DEFAULTS = Limits()
_POLICY_DEFAULTS = QueuePolicy()

SCHEMA: dict[str, dict[str, Key]] = {
    "server": {
        "listen_addr": Key("str", DEFAULT_LISTEN, "host:port to listen on (loopback by default)"),
        "data_dir": Key("str", DEFAULT_DATA_DIR, "where the log and snapshots live"),
        "strict_queues": Key("bool", False, "refuse queues that are not declared in [[queues]]"),
        "tls_cert_path": Key("opt_str", None, "PEM certificate; set both or neither"),
        "tls_key_path": Key("opt_str", None, "PEM private key; set both or neither"),
        "handshake_timeout_ms": Key(
            "int", 10_000, "close connections that send no hello in time", 1
        ),
        "tls_handshake_timeout_ms": Key(
            "int", 5_000, "close a TLS connection whose handshake is not done in time", 1
        ),
        "max_connections": Key(
            "int",
            1024,
            "open connections, TLS handshakes included (see README, Operating it)",
            1,
        ),
        "max_unauthenticated_connections": Key(
            "int",
            128,
            "connections before their hello; past it the oldest of them is closed",
            1,
        ),
        "frame_bytes_max_before_hello": Key(
            "int",
            32 * 1024,
            "largest frame before hello succeeds (limits.max_message_bytes after)",
            1024,
        ),
        "idle_timeout_ms": Key(
            "int",
            600_000,
            "close a connection silent this long after hello (not one awaiting answers); 0 = never",
            0,
        ),
        "descriptors_reserved": Key(
            "int",
            DESCRIPTORS_RESERVED_DEFAULT,
            f"descriptors kept free for storage (it needs {STORAGE_DESCRIPTORS_PEAK} at once)",
            STORAGE_DESCRIPTORS_PEAK,
        ),
        "max_in_flight_per_connection": Key(
            "int", 1024, "requests one connection may have waiting for answers", 1
        ),
        "output_buffer_bytes_max": Key(
            "int", 64 * 1024 * 1024, "disconnect a client that stops reading past this", 65536
        ),
        "shutdown_grace_ms": Key("int", 10_000, "how long shutdown waits for in-flight work", 0),
        "event_loop": Key(
            "str",
            "auto",
            "auto | asyncio | uvloop (auto: uvloop when installed, pip install 'sepp[uvloop]')",
            choices=EVENT_LOOPS,
        ),
        "allocator": Key(
            "str",
            "auto",
            "auto (jemalloc when installed, else python) | jemalloc (memory freed after a"
            " burst goes back to the OS; apt install libjemalloc2) | system (the C library's"
            " malloc: returns memory too, slower) | python (pymalloc: fastest, keeps some"
            " memory after a burst); an explicit PYTHONMALLOC wins",
            choices=ALLOCATORS,
        ),
    },
    "auth": {
        "api_keys": Key(
            "api_keys",
            None,
            'unset = open; [] = deny all; else [{name = "...", key = "..."}] (or plain strings)',
        ),
        "api_keys_file": Key(
            "opt_str",
            None,
            'instead of api_keys: a file (mode 0600) with one key per line, "KEY" or "NAME KEY"',
        ),
    },
    "limits": {
        "max_lease_duration_ms": Key(
            "int", _POLICY_DEFAULTS.max_lease_duration_ms, "lease clamp", 1
        ),
        "default_max_attempts": Key("int", _POLICY_DEFAULTS.default_max_attempts, "", 1),
        "max_attempts_ceiling": Key("int", _POLICY_DEFAULTS.max_attempts_ceiling, "", 1),
        "default_priority": Key("int", _POLICY_DEFAULTS.default_priority, "0..9", 0),
        "retry_delay_ms": Key(
            "int", _POLICY_DEFAULTS.retry_delay_ms, "base delay of a default nack", 0
        ),
        "retry_backoff": Key(
            "str",
            _POLICY_DEFAULTS.retry_backoff,
            "none or exponential",
            choices=("none", "exponential"),
        ),
        "retry_delay_max_ms": Key("int", _POLICY_DEFAULTS.retry_delay_max_ms, "", 1),
        "max_reserve_batch": Key("int", _LIMIT_DEFAULTS.max_reserve_batch, "", 1),
        "max_reserve_queues": Key("int", _LIMIT_DEFAULTS.max_reserve_queues, "", 1),
        "max_wait_timeout_ms": Key(
            "int", _LIMIT_DEFAULTS.max_wait_timeout_ms, "long-poll clamp", 0
        ),
        "max_enqueue_batch": Key("int", _LIMIT_DEFAULTS.max_enqueue_batch, "", 1),
        "max_queue_depth": Key("opt_int", None, "live jobs per queue; unset = unlimited", 0),
        "max_in_flight": Key(
            "opt_int", None, "jobs of a queue leased at once; unset = unlimited", 1
        ),
        "rate_limit": Key(
            "opt_rate_limit",
            None,
            "deliveries of a queue's jobs in any window of per_ms ms; unset = unlimited",
            example=("# rate_limit = { jobs = 100, per_ms = 1000 }",),
        ),
        "weight": Key(
            "int",
            _POLICY_DEFAULTS.weight,
            'a queue\'s turn in a fair reserve (order = "fair"): deliveries in a row, 1..1000',
            1,
        ),
        "max_payload_bytes": Key("int", _POLICY_DEFAULTS.max_payload_bytes, "", 0),
        "max_message_bytes": Key(
            "int", _LIMIT_DEFAULTS.max_message_bytes, "one request on the wire", 1024
        ),
        "max_custom_entries": Key("int", _POLICY_DEFAULTS.max_custom_entries, "", 0),
        "max_custom_total_bytes": Key("int", _POLICY_DEFAULTS.max_custom_total_bytes, "", 0),
        "max_custom_key_bytes": Key("int", _POLICY_DEFAULTS.max_custom_key_bytes, "", 0),
        "max_queue_name_bytes": Key("int", _LIMIT_DEFAULTS.max_queue_name_bytes, "1..65535", 1),
        "max_job_type_bytes": Key("int", _LIMIT_DEFAULTS.max_job_type_bytes, "", 1),
        "max_idempotency_key_bytes": Key("int", _LIMIT_DEFAULTS.max_idempotency_key_bytes, "", 1),
        "max_trace_context_bytes": Key(
            "int", _LIMIT_DEFAULTS.max_trace_context_bytes, "traceparent + tracestate", 1
        ),
        "max_encoding_bytes": Key("int", _LIMIT_DEFAULTS.max_encoding_bytes, "payload encoding", 1),
        "max_worker_id_bytes": Key("int", _LIMIT_DEFAULTS.max_worker_id_bytes, "", 1),
        "max_reason_bytes": Key(
            "int",
            _LIMIT_DEFAULTS.max_reason_bytes,
            "nack reason; at least 4096 (the Python client cuts reasons to 4096)",
            4096,
        ),
        "max_stats_queues": Key(
            "int", _LIMIT_DEFAULTS.max_stats_queues, "names one queue_stats may list", 1
        ),
        "max_schedule_horizon_ms": Key("int", _POLICY_DEFAULTS.max_schedule_horizon_ms, "", 0),
        "allowed_encodings": Key("opt_str_list", None, "unset = any; [] = no payloads"),
    },
    "storage": {
        "persist_mode": Key(
            "str", "sync_all", "sync_all | sync_data | buffer", choices=PERSIST_MODES
        ),
        "sync_method": Key(
            "str",
            "auto",
            "auto | thread | aio: who syncs each group commit (auto: aio where Linux AIO works)",
            choices=SYNC_METHODS,
        ),
        "sweep_interval_ms": Key("int", 1000, "longest sleep between sweeps", 1),
        "sweep_limit": Key("int", 10_000, "entries per sweep phase", 1),
        "dedup_window_ms": Key("int", _POLICY_DEFAULTS.dedup_window_ms, "idempotency window", 0),
        "dead_letter_retention_ms": Key(
            "int", 0, "0 = dead letters are dropped; e.g. 604800000 keeps them 7 days", 0
        ),
        "command_queue_capacity": Key(
            "int", 4096, "commands waiting for the disk before resource_exhausted", 1
        ),
        "segment_bytes_max": Key("int", 64 * 1024 * 1024, "log segment size", 4096),
        "snapshot_every_bytes": Key(
            "int", 256 * 1024 * 1024, "snapshot after this much log; 0 = only at shutdown", 0
        ),
        "log_retention_ms": Key("int", 0, "keep covered log segments this long for audits", 0),
        "snapshots_kept": Key("int", 2, "", 1),
        "buffer_flush_interval_ms": Key("int", 1000, "buffer mode: loss window on an OS crash", 1),
    },
    "admin": {
        "listen_addr": Key(
            "str",
            DEFAULT_ADMIN_LISTEN,
            'host:port of the admin HTTP listener (/metrics, /livez, /readyz); "off" = none; '
            "a non-loopback address needs admin keys",
        ),
        "keys": Key(
            "admin_keys",
            None,
            "admin API keys (Authorization: Bearer KEY); unset = loopback only, open",
            example=(
                "# Each key has a name (the actor in the audit trail) and a role: viewer (reads)",
                "# < operator (fixes jobs and dead letters, pauses, resumes, purges) < admin",
                "# (creates, updates and deletes queues; the default). Without keys a loopback",
                "# listener is open (actor local, role admin) and any other address is refused.",
                "# keys = [",
                '#   { name = "alice", key = "CHANGE-ME-long-random-secret", role = "admin" },',
                '#   { name = "dashboard", key = "CHANGE-ME-another-secret", role = "viewer" },',
                "# ]",
            ),
        ),
        "tls_cert_path": Key(
            "opt_str", None, "PEM certificate of the admin listener (https); set both or neither"
        ),
        "tls_key_path": Key("opt_str", None, "PEM private key of the admin listener"),
        # The web console (sepp/admin/console.py); both read live.
        "session_ttl_ms": Key(
            "int", 12 * 3600 * 1000, "web console: a browser session's lifetime", 60_000
        ),
        "stats_history_ms": Key(
            "int",
            3600 * 1000,
            "web console: the dashboard's in-memory history (one sample a second per "
            "queue; at most 6 h are kept)",
            60_000,
        ),
    },
    "metrics": {
        "listen_addr": Key(
            "str",
            "off",
            "host:port of a listener of its own for /metrics (and /livez, /readyz), no auth, "
            'any address; "off" = /metrics only on the admin listener',
        ),
    },
    "grpc": {
        "listen_addr": Key(
            "str",
            "off",
            "host:port of the gRPC sepp.v1 front for the official clients (the reference "
            'uses port 50051); TLS and API keys as for the native listener; "off" = none',
        ),
    },
    "cluster": {
        "nats_urls": Key(
            "opt_str",
            None,
            "cluster mode (issue 19): the NATS JetStream servers, comma-separated "
            "(nats://host:4222,...); unset = a single node with its own log",
        ),
        "monitor_urls": Key(
            "opt_str",
            None,
            "the JetStream servers' monitoring URLs (http://host:8222,...), to check that "
            "they run with sync_interval: always",
        ),
        "node_id": Key("opt_str", None, "this node's id in the cluster (unique)"),
        "advertise_addr": Key(
            "opt_str",
            None,
            "host:port clients reach this node at (redirects name it); unset = listen_addr",
        ),
        "lease_ttl_ms": Key("int", 3_000, "the leader's lease lapses this long unrenewed", 1000),
        "lease_renew_ms": Key("int", 1_000, "the leader renews its lease this often", 100),
        "snapshot_every_messages": Key(
            "int",
            10_000,
            "followers store a snapshot in the object store every this many log messages "
            "(the two newest kept, the log purged below the older); 0 = never",
            0,
        ),
        "appends_in_flight": Key(
            "int",
            4,
            "the leader's appends to the log outstanding at once, each expecting the one "
            "before it (1..16; 1 = one group commit at a time)",
            1,
        ),
        "nats_user": Key(
            "opt_str",
            None,
            "user name for the NATS servers (with nats_password; docs/cluster.md, "
            "Credentials and TLS)",
        ),
        "nats_password": Key(
            "opt_str",
            None,
            "password of nats_user (a secret: prefer SEPP_CLUSTER__NATS_PASSWORD)",
        ),
        "nats_token": Key(
            "opt_str",
            None,
            "token for NATS token auth, instead of a user (a secret: prefer "
            "SEPP_CLUSTER__NATS_TOKEN)",
        ),
        "creds_file": Key(
            "opt_str",
            None,
            "NATS credentials file (.creds: a user JWT and its nkey seed), instead of a "
            "user or token; needs the nkeys package (the cluster extra brings it)",
        ),
        "tls_ca_file": Key(
            "opt_str",
            None,
            "PEM CA bundle the NATS servers' certificates are checked against (TLS on; "
            "unset with TLS = the system's CAs)",
        ),
        "tls_cert_file": Key(
            "opt_str",
            None,
            "PEM client certificate for NATS TLS (mutual TLS); set both or neither",
        ),
        "tls_key_file": Key("opt_str", None, "PEM private key of tls_cert_file"),
    },
    "logging": {
        "level": Key(
            "str",
            "info",
            "debug | info | warning | error",
            choices=("debug", "info", "warning", "error"),
        ),
        "format": Key("str", "text", "text | json", choices=("text", "json")),
    },
}

# The policy keys the file spells as one table: rate_limit = { jobs, per_ms }.
RATE_LIMIT_KEYS = {"jobs": "rate_limit_jobs", "per_ms": "rate_limit_per_ms"}

# Per-queue keys of [[queues]]: the policy keys, each falling back to its global.
QUEUE_KEYS: dict[str, Key] = {
    name: (
        SCHEMA["storage"]["dedup_window_ms"]
        if name == "dedup_window_ms"
        else Key("opt_str_list", None, "queue-only allow-list")
        if name == "allowed_job_types"
        else SCHEMA["limits"][name]
    )
    for name in POLICY_KEYS
    if name not in RATE_LIMIT_KEYS.values()
}
QUEUE_KEYS["rate_limit"] = SCHEMA["limits"]["rate_limit"]

ALIASES = {("server", "db_path"): ("server", "data_dir")}


@dataclass(frozen=True)
class ApiKey:
    name: str
    key: str


# The roles of admin keys, weakest first (the service's role table: ROLES).
ADMIN_ROLES = ("viewer", "operator", "admin")
ADMIN_ROLE_DEFAULT = "admin"


@dataclass(frozen=True)
class AdminKey:
    """One key of the admin HTTP API ([admin] keys): `name` is the actor the
    audit trail records, never the key."""

    name: str
    key: str
    role: str


@dataclass
class ServerConfig:
    """The loaded, validated configuration."""

    values: dict[str, dict[str, Any]]
    queues: list[dict[str, Any]] = field(default_factory=list)
    source: str | None = None
    # [[schedules]] (issue 17): validated tables, see _schedule_entries.
    schedules: list[dict[str, Any]] = field(default_factory=list)

    def get(self, section: str, key: str) -> Any:
        return self.values[section][key]

    @property
    def listen(self) -> tuple[str, int]:
        return parse_listen(self.get("server", "listen_addr"))

    def _optional_listen(self, section: str) -> tuple[str, int] | None:
        """[section] listen_addr as (host, port), or None when it is off."""
        value = self.get(section, "listen_addr").strip()
        if value.lower() in ADMIN_OFF:
            return None
        return parse_listen(value, f"{section}.listen_addr")

    @property
    def admin_listen(self) -> tuple[str, int] | None:
        """The admin listener's (host, port), or None when it is off."""
        return self._optional_listen("admin")

    @property
    def metrics_listen(self) -> tuple[str, int] | None:
        """The metrics-only listener's (host, port), or None when it is off."""
        return self._optional_listen("metrics")

    @property
    def grpc_listen(self) -> tuple[str, int] | None:
        """The gRPC front's (host, port), or None when it is off (the default)."""
        return self._optional_listen("grpc")

    @property
    def admin_keys(self) -> list[AdminKey]:
        """The admin API's keys ([admin] keys); empty when none are configured."""
        raw = self.get("admin", "keys") or []
        return [AdminKey(k["name"], k["key"], k["role"]) for k in raw]

    @property
    def api_keys(self) -> list[ApiKey] | None:
        raw = self.get("auth", "api_keys")
        if raw is None:
            return None
        return [ApiKey(k["name"], k["key"]) for k in raw]

    def core_config(self) -> CoreConfig:
        lim = self.values["limits"]
        limits = Limits(**{f.name: lim[f.name] for f in dataclasses.fields(Limits)})
        defaults = self._policy({})
        queues = {q["name"]: self._policy(q) for q in self.queues}
        return CoreConfig(
            limits=limits,
            defaults=defaults,
            queues=queues,
            strict_queues=self.get("server", "strict_queues"),
            dead_letter_retention_ms=self.get("storage", "dead_letter_retention_ms"),
            sweep_limit=self.get("storage", "sweep_limit"),
        )

    def _policy(self, overrides: Mapping[str, Any]) -> QueuePolicy:
        values: dict[str, Any] = {}
        rate_limit = overrides.get("rate_limit") or self.get("limits", "rate_limit")
        for name in POLICY_KEYS:
            if name in RATE_LIMIT_KEYS.values():
                field_name = name.removeprefix("rate_limit_")
                values[name] = None if rate_limit is None else rate_limit[field_name]
                continue
            if name in overrides and overrides[name] is not None:
                value = overrides[name]
            elif name == "dedup_window_ms":
                value = self.get("storage", "dedup_window_ms")
            elif name == "allowed_job_types":
                value = None
            else:
                value = self.get("limits", name)
            if name in ("allowed_encodings", "allowed_job_types") and value is not None:
                value = tuple(value)
            values[name] = value
        return QueuePolicy(**values)

    @property
    def cluster(self) -> ClusterSettings | None:
        """[cluster] when cluster mode is on (nats_urls set), else None."""
        c = self.values["cluster"]
        if not c["nats_urls"]:
            return None
        if not c["node_id"]:
            raise ConfigError("cluster.node_id", "cluster mode needs a node id")
        if c["lease_renew_ms"] * 2 > c["lease_ttl_ms"]:
            raise ConfigError("cluster.lease_renew_ms", "must be at most half of lease_ttl_ms")
        host, port = self.listen
        advertise = c["advertise_addr"] or f"{host}:{port}"
        parse_listen(advertise, "cluster.advertise_addr")
        from sepp.cluster.logengine import APPENDS_IN_FLIGHT_MAX

        if c["appends_in_flight"] > APPENDS_IN_FLIGHT_MAX:
            raise ConfigError(
                "cluster.appends_in_flight", f"must be at most {APPENDS_IN_FLIGHT_MAX}"
            )
        _check_nats_auth(c)
        return ClusterSettings(
            nats_urls=[u.strip() for u in c["nats_urls"].split(",") if u.strip()],
            monitor_urls=[u.strip() for u in (c["monitor_urls"] or "").split(",") if u.strip()],
            node_id=c["node_id"],
            advertise_addr=advertise,
            lease_ttl_ms=c["lease_ttl_ms"],
            lease_renew_ms=c["lease_renew_ms"],
            snapshot_every_messages=c["snapshot_every_messages"],
            appends_in_flight=c["appends_in_flight"],
            nats_user=c["nats_user"],
            nats_password=c["nats_password"],
            nats_token=c["nats_token"],
            creds_file=c["creds_file"],
            tls_ca_file=c["tls_ca_file"],
            tls_cert_file=c["tls_cert_file"],
            tls_key_file=c["tls_key_file"],
        )

    def storage_options(self) -> StorageOptions:
        s = self.values["storage"]
        return StorageOptions(
            persist_mode=s["persist_mode"],
            segment_bytes_max=s["segment_bytes_max"],
            snapshot_every_bytes=s["snapshot_every_bytes"],
            log_retention_ms=s["log_retention_ms"],
            snapshots_kept=s["snapshots_kept"],
            buffer_flush_interval_ms=s["buffer_flush_interval_ms"],
        )


def _check_nats_auth(c: Mapping[str, Any]) -> None:
    """[cluster]'s NATS credentials and TLS files: one way to authenticate, pairs
    set together, files that exist (the error names the key, never a secret)."""
    if c["nats_password"] and not c["nats_user"]:
        raise ConfigError("cluster.nats_password", "needs cluster.nats_user")
    if c["nats_user"] and not c["nats_password"]:
        raise ConfigError("cluster.nats_user", "needs cluster.nats_password")
    ways = [
        name
        for name, set_ in (
            ("nats_user", c["nats_user"]),
            ("nats_token", c["nats_token"]),
            ("creds_file", c["creds_file"]),
        )
        if set_
    ]
    if len(ways) > 1:
        raise ConfigError(
            f"cluster.{ways[1]}", f"set one of nats_user, nats_token, creds_file (also {ways[0]})"
        )
    if bool(c["tls_cert_file"]) != bool(c["tls_key_file"]):
        raise ConfigError("cluster.tls_cert_file", "set tls_cert_file and tls_key_file together")
    for name in ("creds_file", "tls_ca_file", "tls_cert_file", "tls_key_file"):
        path = c[name]
        if path and not os.path.isfile(path):
            raise ConfigError(f"cluster.{name}", f"file {path} does not exist")


def parse_listen(value: str, key: str = "server.listen_addr") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(key, f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port_number = int(port)
    except ValueError:
        raise ConfigError(key, f"port {port!r} is not a number") from None
    if not 0 <= port_number <= 65535:
        raise ConfigError(key, f"port {port_number} is out of range")
    return host, port_number


def is_loopback_host(host: str) -> bool:
    """True for a loopback address (127.0.0.0/8, ::1) or "localhost"."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: may resolve to anything


# -- coercion and validation ---------------------------------------------------


def _coerce(where: str, key: Key, value: Any) -> Any:
    kind = key.kind
    if kind in ("int", "opt_int"):
        if value is None and kind == "opt_int":
            return None
        if type(value) is not int:
            raise ConfigError(where, f"must be an integer, got {value!r}")
        if key.minimum is not None and value < key.minimum:
            raise ConfigError(where, f"must be at least {key.minimum}, got {value}")
        return value
    if kind == "bool":
        if type(value) is not bool:
            raise ConfigError(where, f"must be true or false, got {value!r}")
        return value
    if kind in ("str", "opt_str"):
        if value is None and kind == "opt_str":
            return None
        if type(value) is not str or not value:
            raise ConfigError(where, f"must be a non-empty string, got {value!r}")
        if key.choices is not None and value not in key.choices:
            raise ConfigError(where, f"must be one of {', '.join(key.choices)}, got {value!r}")
        return value
    if kind == "opt_str_list":
        if value is None:
            return None
        if type(value) is not list or any(type(v) is not str or not v for v in value):
            raise ConfigError(where, "must be a list of non-empty strings")
        return list(value)
    if kind == "opt_rate_limit":
        return _coerce_rate_limit(where, value)
    if kind == "api_keys":
        return _coerce_api_keys(where, value)
    if kind == "admin_keys":
        return _coerce_admin_keys(where, value)
    raise AssertionError(f"unknown kind {kind}")  # pragma: no cover


def _coerce_rate_limit(where: str, value: Any) -> dict[str, int] | None:
    """`rate_limit = { jobs = N, per_ms = M }`: both integers of at least 1
    (their ceilings are the core's, checked with the policy)."""
    if value is None:
        return None
    if type(value) is not dict:
        raise ConfigError(where, "must be a table { jobs = N, per_ms = M }")
    for key in value:
        if key not in RATE_LIMIT_KEYS:
            raise ConfigError(f"{where}.{key}", "unknown key (jobs and per_ms only)")
    out = {}
    for key in RATE_LIMIT_KEYS:
        if key not in value:
            raise ConfigError(f"{where}.{key}", "is required")
        number = value[key]
        if type(number) is not int:
            raise ConfigError(f"{where}.{key}", f"must be an integer, got {number!r}")
        if number < 1:
            raise ConfigError(f"{where}.{key}", f"must be at least 1, got {number}")
        out[key] = number
    return out


def _coerce_api_keys(where: str, value: Any) -> list[dict[str, str]] | None:
    if value is None:
        return None
    if type(value) is not list:
        raise ConfigError(where, 'must be a list of {name = "...", key = "..."} entries')
    keys = []
    for i, entry in enumerate(value):
        if type(entry) is str:
            entry = {"name": f"key{i + 1}", "key": entry}
        if type(entry) is not dict or set(entry) - {"name", "key"}:
            raise ConfigError(f"{where}[{i}]", "must be {name = ..., key = ...}")
        name, key = entry.get("name"), entry.get("key")
        if type(name) is not str or not name or type(key) is not str or not key:
            raise ConfigError(f"{where}[{i}]", "name and key must be non-empty strings")
        keys.append({"name": name, "key": key})
    _check_unique(where, keys)
    return keys


def _check_unique(where: str, keys: list[dict[str, str]]) -> None:
    """No two keys share a name or a secret."""
    names = [k["name"] for k in keys]
    secrets = [k["key"] for k in keys]
    if len(set(names)) != len(names):
        raise ConfigError(where, "key names must be unique")
    if len(set(secrets)) != len(secrets):
        raise ConfigError(where, "keys must be unique")


def _coerce_admin_keys(where: str, value: Any) -> list[dict[str, str]] | None:
    """[admin] keys: a list of {name, key, role} tables (role defaults to admin);
    names and keys non-empty and unique."""
    if value is None:
        return None
    shape = 'must be a list of {name = "...", key = "...", role = "viewer|operator|admin"} tables'
    if type(value) is not list:
        raise ConfigError(where, shape)
    keys = []
    for i, entry in enumerate(value):
        if type(entry) is not dict or set(entry) - {"name", "key", "role"}:
            raise ConfigError(f"{where}[{i}]", 'must be {name = "...", key = "...", role = "..."}')
        name, key = entry.get("name"), entry.get("key")
        role = entry.get("role", ADMIN_ROLE_DEFAULT)
        if type(name) is not str or not name or type(key) is not str or not key:
            raise ConfigError(f"{where}[{i}]", "name and key must be non-empty strings")
        if role not in ADMIN_ROLES:
            raise ConfigError(
                f"{where}[{i}].role", f"must be one of {', '.join(ADMIN_ROLES)}, got {role!r}"
            )
        keys.append({"name": name, "key": key, "role": role})
    _check_unique(where, keys)
    return keys


def _merge_section(values: dict[str, dict[str, Any]], section: str, raw: Any, origin: str) -> None:
    if type(raw) is not dict:
        raise ConfigError(section, f"[{section}] must be a table ({origin})")
    for key, value in raw.items():
        target_section, target_key = ALIASES.get((section, key), (section, key))
        schema = SCHEMA[target_section]
        if target_key not in schema:
            raise ConfigError(f"{section}.{key}", f"unknown setting ({origin})")
        values[target_section][target_key] = _coerce(
            f"{target_section}.{target_key}", schema[target_key], value
        )


def _queue_entries(raw: Any, origin: str) -> list[dict[str, Any]]:
    if type(raw) is not list:
        raise ConfigError("queues", f"[[queues]] must be an array of tables ({origin})")
    queues = []
    seen = set()
    for i, entry in enumerate(raw):
        if type(entry) is not dict:
            raise ConfigError(f"queues[{i}]", "must be a table")
        name = entry.get("name")
        if type(name) is not str or not name:
            raise ConfigError(f"queues[{i}].name", "is required and must be a non-empty string")
        if name in seen:
            raise ConfigError(f"queues.{name}.name", "is declared twice")
        seen.add(name)
        queue: dict[str, Any] = {"name": name}
        for key, value in entry.items():
            if key == "name":
                continue
            if key in SCHEMA["limits"] and key not in QUEUE_KEYS:
                raise ConfigError(
                    f"queues.{name}.{key}",
                    f"limits.{key} bounds whole requests and cannot be set per queue; set it "
                    f"in [limits] ({origin})",
                )
            if key not in QUEUE_KEYS:
                raise ConfigError(f"queues.{name}.{key}", f"unknown per-queue setting ({origin})")
            queue[key] = _coerce(f"queues.{name}.{key}", QUEUE_KEYS[key], value)
        queues.append(queue)
    return queues


# [[schedules]] keys (issue 17) -> (type, required).
SCHEDULE_KEYS: dict[str, tuple[type, bool]] = {
    "name": (str, True),
    "queue": (str, True),
    "job_type": (str, True),
    "cron": (str, False),
    "every_ms": (int, False),
    "timezone": (str, False),
    "payload": (str, False),
    "encoding": (str, False),
    "catch_up": (str, False),
    "priority": (int, False),
    "max_attempts": (int, False),
}


# The encoding of a [[schedules]] payload that names none (the payload is TOML text).
SCHEDULE_TEXT_ENCODING = "text/plain; charset=utf-8"


def _schedule_entries(raw: Any, origin: str) -> list[dict[str, Any]]:
    """[[schedules]] tables: each key known and of its type, exactly one of cron and
    every_ms, a cron that parses, a known time zone, a catch-up policy. The rest
    (limits, the queue's rules) is decide's, at start-up and reload."""
    if type(raw) is not list:
        raise ConfigError("schedules", f"[[schedules]] must be an array of tables ({origin})")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        if type(entry) is not dict:
            raise ConfigError(f"schedules[{i}]", "must be a table")
        name = entry.get("name")
        if type(name) is not str or not name:
            raise ConfigError(f"schedules[{i}].name", "is required and must be a non-empty string")
        if name in seen:
            raise ConfigError(f"schedules.{name}.name", "is declared twice")
        seen.add(name)
        for key, (_kind, required) in SCHEDULE_KEYS.items():
            if required and key not in entry:
                raise ConfigError(f"schedules.{name}.{key}", f"is required ({origin})")
        for key, value in entry.items():
            if key not in SCHEDULE_KEYS:
                raise ConfigError(f"schedules.{name}.{key}", f"unknown schedule setting ({origin})")
            kind = SCHEDULE_KEYS[key][0]
            if type(value) is not kind:
                raise ConfigError(f"schedules.{name}.{key}", f"must be a {kind.__name__}")
        if ("cron" in entry) == ("every_ms" in entry):
            raise ConfigError(f"schedules.{name}", "needs exactly one of cron and every_ms")
        if "cron" in entry:
            try:
                parse_cron(entry["cron"])
            except CronError as exc:
                raise ConfigError(f"schedules.{name}.cron", str(exc)) from None
        try:
            zone_table(entry.get("timezone", "UTC"))
        except UnknownTimeZone as exc:
            raise ConfigError(f"schedules.{name}.timezone", str(exc)) from None
        if entry.get("catch_up", CATCH_UP_DEFAULT) not in CATCH_UP_POLICIES:
            raise ConfigError(
                f"schedules.{name}.catch_up", f"must be one of {list(CATCH_UP_POLICIES)}"
            )
        entry = dict(entry)
        if "payload" in entry:
            # The payload is text: without an encoding it is plain text (the
            # core refuses a payload without one).
            entry.setdefault("encoding", SCHEDULE_TEXT_ENCODING)
        out.append(entry)
    return out


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text  # then checked as a string: a clear error naming the key


def resolve_config_path(explicit: str | None, env: Mapping[str, str]) -> tuple[str | None, bool]:
    """(path, explicit?) by the precedence --config > SEPP_CONFIG > ./sepp.toml."""
    if explicit:
        return explicit, True
    if env.get(ENV_CONFIG):
        return env[ENV_CONFIG], True
    if os.path.exists(DEFAULT_CONFIG_FILE):
        return DEFAULT_CONFIG_FILE, False
    return None, False


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, str], Any] | None = None,
) -> ServerConfig:
    """Load and validate. Raises ConfigError naming the key and the problem."""
    env = os.environ if env is None else env
    values = {
        section: {k: key.default for k, key in keys.items()} for section, keys in SCHEMA.items()
    }
    queues: list[dict[str, Any]] = []
    schedules: list[dict[str, Any]] = []
    source, _explicit = resolve_config_path(path, env)
    if source is not None:
        try:
            with open(source, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError("config", f"file {source} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("config", f"{source} is not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError("config", f"{source} is not UTF-8 text: {exc}") from None
        except RecursionError:
            raise ConfigError("config", f"{source} nests tables or arrays too deeply") from None
        except OSError as exc:
            raise ConfigError("config", f"cannot read {source}: {exc}") from None
        for section, raw in data.items():
            if section == "queues":
                queues = _queue_entries(raw, source)
            elif section == "schedules":
                schedules = _schedule_entries(raw, source)
            elif section in SCHEMA:
                _merge_section(values, section, raw, source)
            else:
                raise ConfigError(section, f"unknown section [{section}] in {source}")
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG:
            continue
        if name == "SEPP_QUEUES":
            queues = _queue_entries(_env_value(text), f"environment {name}")
            continue
        if name == "SEPP_SCHEDULES":
            schedules = _schedule_entries(_env_value(text), f"environment {name}")
            continue
        if "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        if section == "queues":
            queues = _queue_entries(_env_value(text), f"environment {name}")
            continue
        if section not in SCHEMA:
            raise ConfigError(f"{section}.{key}", f"unknown section in environment variable {name}")
        _merge_section(values, section, {key: _env_value(text)}, f"environment {name}")
    for (section, key), value in (overrides or {}).items():
        if value is not None:
            _merge_section(values, section, {key: value}, "command line")
    config = ServerConfig(values, queues, source, schedules)
    _cross_validate(config)
    return config


def read_api_keys_file(path: str) -> list[dict[str, str]]:
    """The keys of an `auth.api_keys_file`: one per line, `KEY` or `NAME KEY`
    (blank lines and lines starting with # are skipped; a key alone is named
    key1, key2, ... by its place). Keys kept in a file stay out of the config
    file, the environment and the process list (issue 13 §6)."""
    where = "auth.api_keys_file"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(where, f"file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"{path} is not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise ConfigError(where, f"cannot read {path}: {exc.strerror or exc}") from None
    entries: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) > 2:
            raise ConfigError(where, f"{path} line {number}: expected KEY or NAME KEY")
        entries.append(words[0] if len(words) == 1 else {"name": words[0], "key": words[1]})
    if not entries:
        raise ConfigError(where, f"{path} holds no key (to refuse everyone, set api_keys = [])")
    return _coerce_api_keys(where, entries) or []


def _cross_validate(config: ServerConfig) -> None:
    auth = config.values["auth"]
    if auth["api_keys_file"] is not None:
        if auth["api_keys"] is not None:
            raise ConfigError(
                "auth.api_keys_file", "set auth.api_keys or auth.api_keys_file, not both"
            )
        auth["api_keys"] = read_api_keys_file(auth["api_keys_file"])
    for section in ("server", "admin"):
        values = config.values[section]
        if (values["tls_cert_path"] is None) != (values["tls_key_path"] is None):
            raise ConfigError(
                f"{section}.tls_key_path", "tls_cert_path and tls_key_path must be set together"
            )
    parse_listen(config.values["server"]["listen_addr"])
    config.metrics_listen  # noqa: B018 - validates metrics.listen_addr
    config.grpc_listen  # noqa: B018 - validates grpc.listen_addr
    admin = config.admin_listen
    if admin is not None and not is_loopback_host(admin[0]) and not config.admin_keys:
        # Issue 15 item 4: an admin listener others can reach is never open: a
        # non-loopback address needs [admin] keys.
        raise ConfigError(
            "admin.listen_addr",
            f"{admin[0]} is not a loopback address, and a non-loopback admin listener "
            "needs admin keys (none are configured in admin.keys): set admin.keys, or "
            'listen on 127.0.0.1, or set it to "off"',
        )
    limits = config.values["limits"]
    if limits["max_queue_name_bytes"] > 65535:
        raise ConfigError("limits.max_queue_name_bytes", "must be at most 65535")
    validate_config(config.core_config())


# -- TLS -------------------------------------------------------------------------


def load_tls_context(config: ServerConfig, section: str = "server") -> ssl.SSLContext | None:
    """A listener's TLS context from `section`.tls_cert_path and tls_key_path
    ("server": the native listener; "admin": the admin listener), or None without
    them. A file that cannot be read, holds no PEM certificate or key, or a key
    that does not belong to the certificate is a `ConfigError` naming the setting
    and the file (not ssl's bare "[Errno 2]" or "PEM lib")."""
    values = config.values[section]
    cert, key = values["tls_cert_path"], values["tls_key_path"]
    if cert is None or key is None:
        return None
    cert_setting, key_setting = f"{section}.tls_cert_path", f"{section}.tls_key_path"
    for setting, path in ((cert_setting, cert), (key_setting, key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(setting, f"cannot read {path}: {exc.strerror or exc}") from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                key_setting, f"the private key in {key} does not match the "
                f"certificate in {cert} ({cert_setting})",
            ) from None  # fmt: skip
        try:  # which of the two files is unusable?
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(cert)
        except ssl.SSLError:
            raise ConfigError(
                cert_setting, f"{cert} holds no PEM certificate ({exc.reason})"
            ) from None
        raise ConfigError(
            key_setting, f"{key} holds no PEM private key for {cert} ({exc.reason})"
        ) from None
    return context


# -- sepp config example ---------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)  # pragma: no cover


def _wrapped(text: str, width: int = 88) -> list[str]:
    """`text` as comment lines of at most `width` characters."""
    lines: list[str] = []
    line = "#"
    for word in text.split():
        if len(line) + 1 + len(word) > width and line != "#":
            lines.append(line)
            line = "#"
        line += " " + word
    lines.append(line)
    return lines


def example_config() -> str:
    """A complete, commented configuration equal to the built-in defaults."""
    lines = [
        "# sepp configuration. Every setting is shown with its default value.",
        "# Precedence: command-line flags > SEPP_<SECTION>__<KEY> environment variables",
        "# > this file > built-in defaults. Durations are milliseconds (*_ms).",
        "# SIGHUP, or a change of this file, reloads it while the server runs: [auth],",
        "# admin keys, strict_queues, [limits] but max_message_bytes, and [[queues]] switch",
        "# at once; every other setting waits for a restart (README, Hot reload).",
        "",
    ]
    for section, keys in SCHEMA.items():
        lines.append(f"[{section}]")
        for name, key in keys.items():
            if key.doc:
                lines.append(f"# {key.doc}")
            if key.default is None:
                lines.append(f"# {name} = (unset)")
                lines.extend(key.example)
            else:
                lines.append(f"{name} = {_toml_value(key.default)}")
        lines.append("")
    per_queue = [name for name in SCHEMA["limits"] if name in QUEUE_KEYS]
    global_only = [name for name in SCHEMA["limits"] if name not in QUEUE_KEYS]
    lines += [
        "# Declared queues ([[queues]], one table per queue) may override these [limits]",
        *_wrapped("keys for one queue: " + ", ".join(per_queue) + ";"),
        "# and storage.dedup_window_ms; allowed_job_types exists only per queue.",
        *_wrapped(
            "These [limits] keys bound whole requests (which may span queues) and are "
            "global only: " + ", ".join(global_only) + "."
        ),
        *_wrapped(
            "Retries: a nack without a delay (a handler that raised) is retried at once by "
            "default (retry_delay_ms = 0). With retry_delay_ms > 0 it waits that long, "
            'doubled per attempt with retry_backoff = "exponential", at most '
            "retry_delay_max_ms, minus a jitter of up to a quarter (derived from the job id "
            "and attempt, so jobs that failed together spread out). After "
            f"default_max_attempts ({_POLICY_DEFAULTS.default_max_attempts}) attempts the job "
            "is dead-lettered, and dead letters are dropped unless "
            "storage.dead_letter_retention_ms is set. Example:"
        ),
        "# [[queues]]",
        '# name = "emails"',
        "# default_priority = 5",
        "# retry_delay_ms = 5000",
        '# retry_backoff = "exponential"',
        '# allowed_job_types = ["send_welcome", "send_reset"]',
        "",
        *_wrapped(
            "Schedules ([[schedules]], one table per schedule; live on reload, README "
            "Schedules): name, queue, job_type, and cron (5 fields, read in timezone, an "
            'IANA name, default "UTC") or every_ms; payload (text) and encoding, priority, '
            'max_attempts; catch_up = "none" | "one" (default) | "all" for ticks missed '
            "while the server was down. Example:"
        ),
        "# [[schedules]]",
        '# name = "nightly-digest"',
        '# queue = "emails"',
        '# job_type = "send_digest"',
        '# cron = "0 2 * * *"',
        '# timezone = "Europe/Berlin"',
        '# payload = "{}"',
        '# encoding = "application/json"',
        '# catch_up = "one"',
        "",
    ]
    return "\n".join(lines)
