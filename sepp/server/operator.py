"""Operator commands of the `sepp` CLI, over the Python client:

    sepp info                       server version, limits and settings
    sepp stats [QUEUE ...]          per-queue counts (ready, scheduled, in flight, dead)
    sepp enqueue QUEUE JOB_TYPE [--payload TEXT | --payload-file F] [--encoding E]
                 [--priority N] [--delay SECONDS] [--key K] [--max-attempts N]
    sepp dead-letters drain [--queue Q] [--max N]

Each takes `--addr HOST:PORT` (default 127.0.0.1:7463, or $SEPP_ADDR), the API key
as `--api-key-file FILE` (the file's first line; or $SEPP_API_KEY_FILE) or
`--api-key KEY` (or $SEPP_API_KEY; a key on the command line is visible to every
user in the process list), and `--json` for machine-readable output.
Exit code 0 on success, 1 when the server refused or could not be reached (or a
payload file could not be read), 2 for an argument the command cannot use (an
empty queue name, a malformed address); each failure is one line on stderr.
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


def _run(args: argparse.Namespace, action: Callable[[Any], Awaitable[Any]]) -> int:
    from sepp.client import SeppClient, SeppError
    from sepp.client._connection import parse_address

    try:
        parse_address(args.addr)
    except ValueError as exc:
        print(f"sepp {args.command}: --addr: {exc}", file=sys.stderr)
        return 2
    try:
        api_key = _api_key(args)
    except _KeyFileError as exc:
        print(f"sepp {args.command}: {exc}", file=sys.stderr)
        return exc.code

    async def go() -> Any:
        client = await SeppClient.connect(args.addr, api_key=api_key)
        try:
            return await action(client)
        finally:
            await client.close()

    try:
        result = asyncio.run(go())
    except SeppError as exc:
        print(f"sepp: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sepp: cannot reach {args.addr}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_jsonable(result), indent=2))
    else:
        args.render(result)
    return 0


def _render_info(info: Any) -> None:
    for field in dataclasses.fields(info):
        print(f"{field.name:32} {_jsonable(getattr(info, field.name))}")


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


def _render_drain(records: list[Any]) -> None:
    for r in records:
        data = _jsonable(r.payload.data) if r.payload is not None else None
        print(
            f"{r.job_id} queue={r.queue} type={r.job_type} cause={_jsonable(r.cause)} "
            f"failed_at={_jsonable(r.failed_at)} attempt={r.final_attempt} "
            f"reason={r.last_reason!r} payload={data!r}"
        )
    print(f"drained {len(records)} record(s)")


def _info(args: argparse.Namespace) -> int:
    args.render = _render_info
    return _run(args, lambda client: client.get_server_info())


def _stats(args: argparse.Namespace) -> int:
    args.render = _render_stats
    return _run(args, lambda client: client.queue_stats(args.queues or None))


def _enqueue(args: argparse.Namespace) -> int:
    from sepp.client import EnqueueRequest, Payload

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


def _drain(args: argparse.Namespace) -> int:
    from sepp.client import UndecodableDeadLetterError

    undecodable: list[Any] = []

    async def drain(client: Any) -> Any:
        try:
            return await client.drain_dead_letters(queue=args.queue, max_records=args.max)
        except UndecodableDeadLetterError as exc:
            # Deleted on the server already: show the decoded records as usual
            # and every undecodable one raw, then fail.
            undecodable.extend(exc.undecodable)
            return exc.records

    args.render = _render_drain
    status = _run(args, drain)
    for u in undecodable:
        print(
            f"sepp drain: record of job {u.job_id} cannot be decoded ({u.error}); "
            f"raw record: {u.raw!r}",
            file=sys.stderr,
        )
    return 1 if undecodable and status == 0 else status


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--addr", default=os.environ.get("SEPP_ADDR", DEFAULT_ADDR), help="server HOST:PORT"
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

    enqueue = sub.add_parser("enqueue", help="enqueue one job")
    enqueue.add_argument("queue")
    enqueue.add_argument("job_type")
    enqueue.add_argument("--payload", help="payload text (UTF-8)")
    enqueue.add_argument("--payload-file", help="read the payload from this file")
    enqueue.add_argument("--encoding", default="application/json", help="payload encoding hint")
    enqueue.add_argument("--priority", type=int, choices=range(10), metavar="0-9")
    enqueue.add_argument("--delay", type=float, default=0.0, help="run after this many seconds")
    enqueue.add_argument("--key", help="idempotency key")
    enqueue.add_argument("--max-attempts", type=int)
    _common(enqueue)
    enqueue.set_defaults(func=_enqueue)

    dead = sub.add_parser("dead-letters", help="dead-letter store")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    drain = dead_sub.add_parser(
        "drain", help="remove and print dead letters, oldest first (destructive)"
    )
    drain.add_argument("--queue", help="only this queue")
    drain.add_argument(
        "--max", type=int, default=256, help="at most this many records (server caps at 256)"
    )
    _common(drain)
    drain.set_defaults(func=_drain)
