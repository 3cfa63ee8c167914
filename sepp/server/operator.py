"""Operator commands of the `sepp` CLI, over the Python client:

    sepp info                       server version, limits and settings
    sepp stats [QUEUE ...]          per-queue counts (ready, scheduled, in flight, dead)
    sepp enqueue QUEUE JOB_TYPE [--payload TEXT | --payload-file F] [--encoding E]
                 [--priority N] [--delay SECONDS] [--key K] [--max-attempts N]
    sepp enqueue --from-jsonl FILE [--keep-keys]   replay drained dead letters
    sepp jobs get|list|cancel ...   (sepp/server/operator_admin.py)
    sepp dead-letters list|show|requeue|delete ...  (sepp/server/operator_admin.py)
    sepp dead-letters drain [--queue Q] [--max N] [--out FILE]  (operator_drain.py)
    sepp queues list|pause|resume|purge|create|update|delete ...  (operator_admin.py)

Each takes `--addr ADDR` (default 127.0.0.1:7463, or $SEPP_ADDR), the API key
as `--api-key-file FILE` (the file's first line; or $SEPP_API_KEY_FILE) or
`--api-key KEY` (or $SEPP_API_KEY; a key on the command line is visible to every
user in the process list), and `--json` for machine-readable output.

TLS: `--addr tls://HOST:PORT` (or `https://HOST:PORT`) speaks TLS and verifies
the server against the system's trusted CAs; `--tls-ca FILE` (PEM) verifies it
against that CA instead, and turns TLS on by itself. There is no option to skip
verification. A CA file that cannot be read is exit 1; a server whose
certificate does not verify is exit 1 (`cannot connect ...: CERTIFICATE_VERIFY_FAILED`).

Output: `--json` prints one JSON document per command, except the listings
(`jobs list`, `dead-letters list`, `queues list`) and `dead-letters drain`,
which print JSON lines (one job or queue per line) so they can stream.
Exit code 0 on success, 1 when the server refused or could not be reached (or
a file could not be read, or an id of a bulk command was not done), 2 for an
argument the command cannot use (an empty queue name, a malformed address, a
destructive command without `--yes`); each failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

DEFAULT_ADDR = "127.0.0.1:7463"


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "name") and hasattr(value, "value") and not isinstance(value, str | int):
        return value.name.lower()  # enums
    return value


class _KeyFileError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def read_api_key_file(path: str) -> str:
    """The API key held in `path`: its first line, without surrounding blanks (a
    trailing newline is usual). Raises _KeyFileError (exit code 1 when the file
    cannot be read, 2 when it holds no key)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise _KeyFileError(f"cannot read {path}: {reason}", 1) from None
    key = first.strip()
    if not key:
        raise _KeyFileError(f"{path} holds no key (its first line is empty)", 2)
    return key


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from the flags, else from the environment; a flag beats any
    variable, and the two flags (or the two variables) together are refused."""
    if args.api_key is not None and args.api_key_file is not None:
        raise _KeyFileError("give --api-key or --api-key-file, not both", 2)
    if args.api_key is not None:
        return str(args.api_key)
    if args.api_key_file is not None:
        return read_api_key_file(args.api_key_file)
    env_key, env_file = os.environ.get("SEPP_API_KEY"), os.environ.get("SEPP_API_KEY_FILE")
    if env_key is not None and env_file is not None:
        raise _KeyFileError("set SEPP_API_KEY or SEPP_API_KEY_FILE, not both", 2)
    if env_file is not None:
        return read_api_key_file(env_file)
    return env_key


class UsageError(Exception):
    """An argument the command cannot use: exit 2, one line on stderr."""


class RefusedError(Exception):
    """The command did not do (all of) what was asked: exit 1, one line on stderr."""


def _tls_options(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The address to dial and the client's TLS arguments: `tls://` means TLS with
    the system CAs (the client spells it `https://`), `--tls-ca FILE` verifies
    against that CA. Raises _KeyFileError (1) for a CA file that cannot be used."""
    import ssl

    addr = str(args.addr)
    if addr.lower().startswith("tls://"):
        addr = "https://" + addr[len("tls://") :]
    ca = getattr(args, "tls_ca", None)
    if ca is None:
        return addr, {}
    try:
        context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise _KeyFileError(f"--tls-ca {ca}: {reason}", 1) from None
    return addr, {"tls": context}


def _run(
    args: argparse.Namespace,
    action: Callable[[Any], Awaitable[Any]],
    render: Callable[[Any], None] | None = None,
) -> int:
    """Connect (TLS as asked), run `action(client)` and print its result
    (`--json`: one JSON document; else `render`, or `args.render`). Without
    either the action printed for itself. The exit code as the module docstring
    says: an action raises UsageError (2) or RefusedError (1) to fail."""
    from sepp.client import SeppClient, SeppError
    from sepp.client._connection import parse_address

    name = _command_name(args)
    try:
        addr, tls = _tls_options(args)
        parse_address(addr)
    except ValueError as exc:
        print(f"sepp {name}: --addr: {exc}", file=sys.stderr)
        return 2
    except _KeyFileError as exc:
        print(f"sepp {name}: {exc}", file=sys.stderr)
        return exc.code
    try:
        api_key = _api_key(args)
    except _KeyFileError as exc:
        print(f"sepp {name}: {exc}", file=sys.stderr)
        return exc.code

    async def go() -> Any:
        # `sepp info` reports the node it was pointed at (cluster mode: its own
        # role, epoch and leader), not the leader the client would move on to.
        follow = getattr(args, "follow_leader", True)
        client = await SeppClient.connect(addr, api_key=api_key, follow_leader=follow, **tls)
        try:
            return await action(client)
        finally:
            await client.close()

    try:
        result = asyncio.run(go())
    except UsageError as exc:
        print(f"sepp {name}: {exc}", file=sys.stderr)
        return 2
    except (RefusedError, SeppError) as exc:
        print(f"sepp {name}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sepp {name}: cannot reach {args.addr}: {exc}", file=sys.stderr)
        return 1
    render = render or getattr(args, "render", None)
    if render is None:
        return 0
    if args.json:
        print(json.dumps(_jsonable(result), indent=2))
    else:
        render(result)
    return 0


def _command_name(args: argparse.Namespace) -> str:
    sub = getattr(args, "dead_command", None) or getattr(args, "sub_command", None)
    return f"{args.command} {sub}" if sub else str(args.command)


def _render_info(info: Any) -> None:
    for field in dataclasses.fields(info):
        if field.name == "cluster":
            continue
        print(f"{field.name:32} {_jsonable(getattr(info, field.name))}")
    cluster = getattr(info, "cluster", None)
    if cluster is not None:  # cluster mode (issue 19): this node's view
        print(f"{'role':32} {cluster.role}")
        print(f"{'node_id':32} {cluster.node_id}")
        print(f"{'epoch':32} {cluster.epoch}")
        print(f"{'leader':32} {cluster.leader or '(none known)'}")


def _render_stats(stats: list[Any]) -> None:
    header = f"{'queue':24} {'ready':>9} {'scheduled':>9} {'in flight':>9} {'dead':>9} {'oldest ready':>13}"
    print(header)
    print("-" * len(header))
    for s in stats:
        age = "" if s.oldest_ready_age is None else f"{s.oldest_ready_age.total_seconds():.1f}s"
        print(
            f"{s.name:24} {s.ready:>9} {s.scheduled:>9} {s.in_flight:>9} {s.dead_lettered:>9} {age:>13}"
        )
    if not stats:
        print("(no queues)")


def _render_enqueue(ack: Any) -> None:
    print(f"{ack.job_id}{' (deduplicated)' if ack.deduplicated else ''}")


def _info(args: argparse.Namespace) -> int:
    args.render = _render_info
    args.follow_leader = False
    return _run(args, lambda client: client.get_server_info())


def _stats(args: argparse.Namespace) -> int:
    args.render = _render_stats
    return _run(args, lambda client: client.queue_stats(args.queues or None))


def _enqueue(args: argparse.Namespace) -> int:
    from sepp.client import EnqueueRequest, Payload

    if args.from_jsonl is not None:
        if args.queue is not None or args.job_type is not None:
            print("sepp enqueue: --from-jsonl takes no QUEUE or JOB_TYPE", file=sys.stderr)
            return 2
        from sepp.server.operator_drain import replay_jsonl

        return replay_jsonl(args)
    if args.queue is None or args.job_type is None:
        print("sepp enqueue: give QUEUE and JOB_TYPE (or --from-jsonl FILE)", file=sys.stderr)
        return 2
    if args.payload is not None and args.payload_file is not None:
        print("sepp: give --payload or --payload-file, not both", file=sys.stderr)
        return 2
    data: bytes | None = None
    if args.payload is not None:
        data = args.payload.encode()
    elif args.payload_file is not None:
        try:
            with open(args.payload_file, "rb") as f:
                data = f.read()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(f"sepp enqueue: cannot read --payload-file {args.payload_file}: {reason}",
                  file=sys.stderr)  # fmt: skip
            return 1
    try:
        request = EnqueueRequest(
            args.queue,
            args.job_type,
            payload=Payload(data, args.encoding) if data else None,
            idempotency_key=args.key,
            priority=args.priority,
            max_attempts=args.max_attempts,
            scheduled_at=datetime.now(UTC) + timedelta(seconds=args.delay) if args.delay else None,
        )
    except ValueError as exc:  # an empty queue or job type
        print(f"sepp enqueue: {exc}", file=sys.stderr)
        return 2
    except OverflowError:
        print(f"sepp enqueue: --delay {args.delay:g} is too far in the future", file=sys.stderr)
        return 2
    args.render = _render_enqueue
    return _run(args, lambda client: client.enqueue(request))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--addr",
        default=os.environ.get("SEPP_ADDR", DEFAULT_ADDR),
        help="server HOST:PORT; tls://HOST:PORT (or https://) for TLS verified "
        "against the system CAs",
    )
    parser.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="speak TLS and verify the server against this CA certificate (PEM)",
    )
    parser.add_argument(
        "--api-key",
        help="API key (default $SEPP_API_KEY); visible to other users in the process "
        "list: prefer --api-key-file",
    )
    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="read the API key from the first line of FILE (default $SEPP_API_KEY_FILE)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_operator_commands(sub: Any) -> None:
    info = sub.add_parser("info", help="server version, limits and settings")
    _common(info)
    info.set_defaults(func=_info)

    stats = sub.add_parser("stats", help="per-queue job counts")
    stats.add_argument("queues", nargs="*", help="queues to show (default: all)")
    _common(stats)
    stats.set_defaults(func=_stats)

    enqueue = sub.add_parser(
        "enqueue", help="enqueue one job, or replay the JSON lines of a drain (--from-jsonl)"
    )
    enqueue.add_argument("queue", nargs="?")
    enqueue.add_argument("job_type", nargs="?")
    enqueue.add_argument(
        "--from-jsonl",
        metavar="FILE",
        help="enqueue every job of FILE (the JSON lines of `sepp dead-letters drain`; "
        "- = stdin) as a new job",
    )
    enqueue.add_argument(
        "--keep-keys",
        action="store_true",
        help="with --from-jsonl: keep the jobs' idempotency keys (a key still in its "
        "dedup window makes the replay a duplicate that is not enqueued)",
    )
    enqueue.add_argument("--payload", help="payload text (UTF-8)")
    enqueue.add_argument("--payload-file", help="read the payload from this file")
    enqueue.add_argument("--encoding", default="application/json", help="payload encoding hint")
    enqueue.add_argument("--priority", type=int, choices=range(10), metavar="0-9")
    enqueue.add_argument("--delay", type=float, default=0.0, help="run after this many seconds")
    enqueue.add_argument("--key", help="idempotency key")
    enqueue.add_argument("--max-attempts", type=int)
    _common(enqueue)
    enqueue.set_defaults(func=_enqueue)

    from sepp.server.operator_admin import add_admin_commands

    add_admin_commands(sub)
