"""The `sepp` command: run the server, print the example config, and operate a
running server.

    sepp serve [--config FILE] [--data-dir DIR] [--listen HOST:PORT] [--admin-listen HOST:PORT]
               [--grpc-listen HOST:PORT]
               [--persist-mode sync_all|sync_data|buffer] [--api-keys-file FILE]
    sepp config example
    sepp info | stats | enqueue QUEUE JOB_TYPE [...] | enqueue --from-jsonl FILE
    sepp jobs get|list|cancel ... | dead-letters list|show|requeue|delete|drain ...
    sepp queues list|pause|resume|purge|create|update|delete ...
         (operator commands, each with --addr, --tls-ca, --api-key-file or --api-key,
         --json: sepp/server/operator.py and operator_admin.py, operator_drain.py)
    sepp backup DEST [--admin-addr URL] [--admin-key-file FILE]   (backup_cli.py)

Exit codes: 0 normal shutdown or success; 1 startup or configuration error, or an
operator command that failed; 2 usage error; 3 storage failure while running.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from sepp._version import __version__
from sepp.cluster.replog import ReplicatedLogError
from sepp.core.config import ConfigError
from sepp.server.allocator import AllocatorUnavailable, allocator_in_use, use_allocator
from sepp.server.config import example_config, load_config, load_tls_context
from sepp.server.logs import setup_logging
from sepp.server.loops import resolve_event_loop, run_on
from sepp.server.pipeline import resolve_sync_method
from sepp.storage import PERSIST_MODES, RecoveryError

log = logging.getLogger("sepp.server")


def _serve(args: argparse.Namespace) -> int:
    from sepp.server.server import SeppServer

    overrides = {
        ("server", "data_dir"): args.data_dir,
        ("server", "listen_addr"): args.listen,
        ("admin", "listen_addr"): args.admin_listen,
        ("grpc", "listen_addr"): args.grpc_listen,
        ("storage", "persist_mode"): args.persist_mode,
        ("auth", "api_keys_file"): args.api_keys_file,
        ("cluster", "nats_urls"): args.cluster,
        ("cluster", "node_id"): args.node_id,
        ("cluster", "advertise_addr"): args.advertise,
    }
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"sepp: invalid configuration: {exc}", file=sys.stderr)
        return 1
    if args.from_command_line:
        # Before anything is opened: this may re-execute the process (allocator.py).
        try:
            use_allocator(config.get("server", "allocator"))
        except AllocatorUnavailable as exc:
            print(f"sepp: invalid configuration: {exc}", file=sys.stderr)
            return 1
    setup_logging(config.get("logging", "level"), config.get("logging", "format"))
    try:
        loop_name = resolve_event_loop(config.get("server", "event_loop"))
        resolve_sync_method(
            config.get("storage", "sync_method"),
            config.get("storage", "persist_mode"),
            real_fs=True,
        )
        # Read the TLS files now, before recovery, so a missing or mismatched
        # file is one line naming the setting and the file.
        load_tls_context(config)
        load_tls_context(config, "admin")
        config.cluster  # noqa: B018 - checks [cluster] (node_id, advertise_addr) now
    except ConfigError as exc:
        print(f"sepp: invalid configuration: {exc}", file=sys.stderr)
        return 1
    log.info("memory allocator: %s", allocator_in_use(os.environ))

    async def run() -> int:
        server = SeppServer(config)
        loop = asyncio.get_running_loop()
        # A SIGHUP during recovery is kept for later (its default action ends the
        # process), then reloads once serving.
        hups: list[int] = []
        loop.add_signal_handler(signal.SIGHUP, hups.append, 1)
        try:
            host, port = await server.start()
        except (RecoveryError, ConfigError) as exc:
            log.critical("cannot start: %s", exc)
            return 1
        except OSError as exc:
            log.critical("cannot start: %s", exc)
            return 1
        except ReplicatedLogError as exc:  # cluster mode: JetStream refused or unreachable
            log.critical("cannot start: %s", exc)
            return 1
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_shutdown)
        # Hot reload: SIGHUP and a change of the config file (reload.py).
        reloader = server.watch_config(lambda: load_config(args.config, overrides=overrides))
        loop.add_signal_handler(signal.SIGHUP, reloader.reload)
        if hups:
            reloader.reload()
        shown = f"[{host}]" if ":" in host else host
        print(f"sepp listening on {shown}:{port}", flush=True)
        if server.admin_address is not None:
            admin_host, admin_port = server.admin_address
            admin_shown = f"[{admin_host}]" if ":" in admin_host else admin_host
            scheme = "https" if server.admin is not None and server.admin.ssl_context else "http"
            print(f"sepp admin on {scheme}://{admin_shown}:{admin_port}", flush=True)
        if server.metrics_address is not None:
            metrics_host, metrics_port = server.metrics_address
            metrics_shown = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
            print(f"sepp metrics on http://{metrics_shown}:{metrics_port}", flush=True)
        if server.grpc_address is not None:
            grpc_host, grpc_port = server.grpc_address
            grpc_shown = f"[{grpc_host}]" if ":" in grpc_host else grpc_host
            print(f"sepp grpc on {grpc_shown}:{grpc_port}", flush=True)
        return await server.wait_stopped()

    try:
        return run_on(loop_name, run)
    except KeyboardInterrupt:  # pragma: no cover - signal handler normally wins
        return 0


def _config(args: argparse.Namespace) -> int:
    if args.action == "example":
        sys.stdout.write(example_config())
        return 0
    return 2  # pragma: no cover - argparse restricts choices


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sepp", description="sepp: a durable job queue")
    parser.add_argument("--version", action="version", version=f"sepp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server until SIGTERM / Ctrl-C")
    serve.add_argument(
        "--config", help="TOML config file (default: $SEPP_CONFIG, else ./sepp.toml if present)"
    )
    serve.add_argument("--data-dir", help="data directory (default ./sepp-data)")
    serve.add_argument(
        "--listen", help="HOST:PORT to listen on (default 127.0.0.1:7463; port 0 = any)"
    )
    serve.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="the admin HTTP listener (/metrics, /livez, /readyz): default 127.0.0.1:9465; "
        'port 0 = any; "off" = none',
    )
    serve.add_argument(
        "--grpc-listen",
        metavar="HOST:PORT",
        help="the gRPC sepp.v1 front for the official clients (grpc.listen_addr): default "
        "off; the reference uses port 50051; port 0 = any; needs the extra sepp[grpc]",
    )
    serve.add_argument("--persist-mode", choices=PERSIST_MODES, help="default sync_all")
    serve.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help='the API keys, one per line ("KEY" or "NAME KEY"): auth.api_keys_file',
    )
    serve.add_argument(
        "--cluster",
        metavar="URLS",
        help="cluster mode (issue 19): the NATS JetStream servers, comma-separated "
        "(cluster.nats_urls)",
    )
    serve.add_argument("--node-id", metavar="ID", help="this node's id (cluster.node_id)")
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="where clients reach this node, named in redirects (cluster.advertise_addr; "
        "default the listen address)",
    )
    serve.set_defaults(func=_serve)

    config = sub.add_parser("config", help="configuration helpers")
    config.add_argument(
        "action", choices=["example"], help="example: print a complete commented config"
    )
    config.set_defaults(func=_config)

    try:
        from sepp.server.operator import add_operator_commands
    except ImportError:  # pragma: no cover - the client library is part of the package
        pass
    else:
        add_operator_commands(sub)
    from sepp.server.backup_cli import add_backup_command

    add_backup_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Only a real command line may re-execute itself (`serve`, allocator.py);
    # main() called in a process that is not sepp's own never does.
    args.from_command_line = argv is None
    try:
        code: int = args.func(args)
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
