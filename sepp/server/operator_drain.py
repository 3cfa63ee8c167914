"""`sepp dead-letters drain`: move dead letters off the server into JSON lines
without losing one, and `sepp enqueue --from-jsonl` to enqueue them again.

    sepp dead-letters drain [--queue Q] [--max N] [--out FILE] [--reason R]
    sepp enqueue --from-jsonl FILE [--keep-keys]

The drain never deletes a record it has not handed over. It reads a page of
dead letters without consuming them (`list_dead_letters`), writes each as one
JSON line (`job_doc`: id, queue, job type, payload as base64 with its encoding,
priority, max_attempts, custom map, trace context, idempotency key, attempt,
cause, last reason, times), and only then deletes exactly the ids written
(`delete_dead_letters` by ids). "Written" depends on where the lines go:

- `--out FILE` (appended to, never truncated) or stdout redirected to a file:
  the page is flushed and fsync-ed before its ids are deleted;
- stdout a pipe: one record at a time, and a record counts as written once the
  reader has taken it out of the pipe (Linux: FIONREAD on the pipe), so
  `sepp dead-letters drain | head -1` deletes the one record `head` read. A
  reader that goes away with a record still in the pipe leaves that record on
  the server;
- anything else (a terminal): once the write returned.

When writing fails (the reader went away, the disk is full) the drain stops,
deletes nothing it did not write, and exits 1 with one line on stderr saying
how many records were written and deleted. `--max N` (N >= 1; default: every
dead letter) bounds the records drained. A record written whose delete then
finds it gone (someone requeued or deleted it meanwhile) is counted as
`already gone`. If the drain is killed between writing and deleting, the next
drain writes those records again: duplicates, never a loss.

`sepp enqueue --from-jsonl FILE` enqueues every line as a new job (new id,
attempts from 1, now): same queue, type, payload, priority, max attempts,
custom map and trace context. Idempotency keys are dropped unless
`--keep-keys` (a key still in its dedup window would make the job a duplicate
of the dead one, and nothing would be enqueued). An unfinished last line (no
newline: a write the disk refused) is skipped with a warning, as its record
was never deleted; any other malformed line refuses the whole file before
anything is enqueued.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import fcntl
import json
import os
import select
import stat
import struct
import sys
import termios
from typing import Any, BinaryIO

from sepp.server.operator import RefusedError, _common, _run
from sepp.server.operator_admin import ADMIN_IDS_PER_CALL_MAX, job_doc

# Dead letters read per listing call while draining.
DRAIN_PAGE_JOBS = 100
# Jobs per enqueue call when replaying (under the server's max_enqueue_batch).
REPLAY_BATCH_JOBS = 100
# How long to wait between looks at a pipe the reader has not emptied yet.
PIPE_POLL_MS_MAX = 50


class DrainWriteError(Exception):
    """Writing the records failed: the drain stops (exit 1)."""


def _unread_bytes(fd: int) -> int | None:
    """Bytes written to the pipe `fd` that its reader has not read yet, or None
    when the system cannot tell (FIONREAD on a pipe's write end: Linux)."""
    buf = bytearray(struct.calcsize("i"))
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return None
    return int(struct.unpack("i", buf)[0])


class Sink:
    """Where the drained lines go. `write` takes one record's line; `settle`
    returns how many of the records written since the last `settle` were handed
    over (all of them, or raise DrainWriteError)."""

    def write(self, line: bytes) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        raise NotImplementedError


class FileSink(Sink):
    """A regular file (or a device): written, flushed, then fsync-ed."""

    def __init__(self, stream: BinaryIO, name: str) -> None:
        self.stream = stream
        self.name = name
        fd = stream.fileno()
        self.regular = stat.S_ISREG(os.fstat(fd).st_mode)

    def write(self, line: bytes) -> None:
        self.stream.write(line)

    def settle(self) -> None:
        self.stream.flush()
        if self.regular:
            os.fsync(self.stream.fileno())


class PipeSink(Sink):
    """A pipe: each record is handed over once the reader took it out of the
    pipe. `write` waits for that (so the pipe never holds more than one record
    the reader might drop); a reader gone first raises BrokenPipeError."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.poller = select.poll()
        # POLLERR (no reader left) is always reported; nothing else is asked for.
        self.poller.register(fd, 0)

    def write(self, line: bytes) -> None:
        view = memoryview(line)
        while view:
            view = view[os.write(self.fd, view) :]
        self._wait_taken()

    def _wait_taken(self) -> None:
        wait_ms = 0
        while True:
            unread = _unread_bytes(self.fd)
            if unread is None or unread == 0:
                return
            for _fd, events in self.poller.poll(wait_ms):
                # The reader is gone: the record was handed over only if it took
                # it out of the pipe first.
                if events & (select.POLLERR | select.POLLHUP) and _unread_bytes(self.fd):
                    raise BrokenPipeError(errno.EPIPE, "Broken pipe")
            wait_ms = min(max(1, wait_ms * 2), PIPE_POLL_MS_MAX)

    def settle(self) -> None:
        return None


class TextSink(Sink):
    """A text stream without a descriptor (tests capturing stdout)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, line: bytes) -> None:
        self.stream.write(line.decode())

    def settle(self) -> None:
        self.stream.flush()


def _stdout_sink() -> Sink:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return TextSink(sys.stdout)
    sys.stdout.flush()
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) and _unread_bytes(fd) is not None:
        return PipeSink(fd)
    return FileSink(open(fd, "ab", buffering=0, closefd=False), "stdout")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _drain(args: argparse.Namespace) -> int:
    stream: BinaryIO | None = None
    if args.out is not None:
        try:
            stream = open(args.out, "ab")  # noqa: SIM115 - closed below
        except OSError as exc:
            print(
                f"sepp dead-letters drain: cannot open --out {args.out}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
    where = "stdout" if args.out is None else args.out
    counts = {"written": 0, "deleted": 0, "already_gone": 0}

    async def drain(client: Any) -> dict[str, Any]:
        sink: Sink = _stdout_sink() if stream is None else FileSink(stream, where)
        queues = (
            [args.queue]
            if args.queue is not None
            else [q.name for q in await client.list_queues() if q.dead_letter > 0]
        )
        reason = args.reason or f"sepp dead-letters drain to {where}"
        budget = args.max
        for queue in queues:
            cursor: str | None = None
            while budget is None or counts["written"] < budget:
                limit = DRAIN_PAGE_JOBS
                if budget is not None:
                    limit = min(limit, budget - counts["written"])
                page = await client.list_dead_letters(queue, cursor=cursor, limit=limit)
                handed: list[str] = []
                failure: OSError | None = None
                try:
                    for info in page.jobs:
                        line = json.dumps(job_doc(info), separators=(",", ":")) + "\n"
                        sink.write(line.encode())
                        if isinstance(sink, PipeSink):
                            handed.append(info.job_id)
                    sink.settle()
                    handed = [info.job_id for info in page.jobs]
                except OSError as exc:
                    failure = exc
                await _delete(client, handed, reason, counts)
                if failure is not None:
                    why = (
                        "the reader went away"
                        if isinstance(failure, BrokenPipeError)
                        else failure.strerror or str(failure)
                    )
                    raise DrainWriteError(
                        f"cannot write to {where}: {why}; "
                        f"stopped after {counts['written']} record(s) written and deleted "
                        "(nothing else deleted)"
                    )
                cursor = page.next_cursor
                if cursor is None:
                    break
        return {"out": where, **counts}

    try:
        status = _run(args, _guarded(drain), _render_summary if args.out is not None else None)
    finally:
        if stream is not None:
            # Everything handed over was flushed already; a close that fails
            # (the disk refused the unflushed rest) has been reported.
            with contextlib.suppress(OSError):
                stream.close()
    if status == 0 and args.out is None and not args.json:
        print(
            f"sepp: drained {counts['written']} dead letter(s)"
            + (f", {counts['already_gone']} already gone" if counts["already_gone"] else ""),
            file=sys.stderr,
        )
    return status


def _guarded(drain: Any) -> Any:
    async def go(client: Any) -> Any:
        try:
            return await drain(client)
        except DrainWriteError as exc:
            raise RefusedError(str(exc)) from None

    return go


async def _delete(client: Any, ids: list[str], reason: str, counts: dict[str, int]) -> None:
    """Delete exactly `ids` (records already handed over), in calls of at most
    1,000; a failure here leaves them on the server (the next drain writes them
    again)."""
    for start in range(0, len(ids), ADMIN_IDS_PER_CALL_MAX):
        chunk = ids[start : start + ADMIN_IDS_PER_CALL_MAX]
        answer = await client.delete_dead_letters(chunk, reason=reason)
        counts["written"] += len(chunk)
        done = len(answer.done)
        counts["deleted"] += done
        counts["already_gone"] += len(chunk) - done


def _render_summary(result: dict[str, Any]) -> None:
    gone = f", {result['already_gone']} already gone" if result["already_gone"] else ""
    print(f"drained {result['written']} dead letter(s) to {result['out']}{gone}")


def add_drain_command(dead_sub: Any) -> None:
    drain = dead_sub.add_parser(
        "drain",
        help="write dead letters as JSON lines, then delete exactly those written",
    )
    drain.add_argument("--queue", help="only this queue (default: every queue)")
    drain.add_argument(
        "--max", type=_positive, help="at most this many records (1 or more; default: all)"
    )
    drain.add_argument("--out", metavar="FILE", help="append the records to FILE (fsync-ed)")
    drain.add_argument("--reason", help="recorded in the audit trail with the deletes")
    _common(drain)
    drain.set_defaults(func=_drain)


# -- replay --------------------------------------------------------------------------------


def _request(doc: Any, keep_keys: bool) -> Any:
    from sepp.client import EnqueueRequest, Payload, TraceContext

    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    payload = doc.get("payload")
    trace = doc.get("trace_context")
    return EnqueueRequest(
        queue=doc["queue"],
        job_type=doc["job_type"],
        payload=None
        if payload is None
        else Payload(base64.b64decode(payload["data_base64"], validate=True), payload["encoding"]),
        idempotency_key=doc.get("idempotency_key") if keep_keys else None,
        priority=doc.get("priority"),
        max_attempts=doc.get("max_attempts"),
        custom=doc.get("custom") or {},
        trace_context=None
        if trace is None
        else TraceContext(trace["traceparent"], trace.get("tracestate")),
    )


def _read_jsonl(path: str, keep_keys: bool) -> tuple[list[tuple[int, Any, Any]], int]:
    """(line number, original doc, request) of every line, and the number of an
    unfinished last line skipped (0 or 1). Raises ValueError naming the line."""
    if path == "-":
        text = sys.stdin.buffer.read()
    else:
        with open(path, "rb") as f:
            text = f.read()
    lines = text.split(b"\n")
    unfinished = lines.pop()  # after the last newline: b"" when the file is whole
    out: list[tuple[int, Any, Any]] = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
            out.append((number, doc, _request(doc, keep_keys)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return out, 1 if unfinished.strip() else 0


def replay_jsonl(args: argparse.Namespace) -> int:
    try:
        jobs, skipped = _read_jsonl(args.from_jsonl, args.keep_keys)
    except OSError as exc:
        print(
            f"sepp enqueue: cannot read --from-jsonl {args.from_jsonl}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    except ValueError as exc:
        print(f"sepp enqueue: --from-jsonl {args.from_jsonl}: {exc}", file=sys.stderr)
        return 1
    if skipped:
        print(
            f"sepp enqueue: skipped the unfinished last line of {args.from_jsonl} "
            "(its record was never deleted)",
            file=sys.stderr,
        )

    async def go(client: Any) -> None:
        from sepp.client import JobRejection

        rejected = 0
        for start in range(0, len(jobs), REPLAY_BATCH_JOBS):
            batch = jobs[start : start + REPLAY_BATCH_JOBS]
            results = await client.enqueue_batch([request for _, _, request in batch])
            for (number, doc, _), result in zip(batch, results, strict=True):
                if isinstance(result, JobRejection):
                    rejected += 1
                    row: dict[str, Any] = {
                        "line": number,
                        "id": doc.get("id"),
                        "rejected": str(result),
                    }
                else:
                    row = {
                        "line": number,
                        "id": doc.get("id"),
                        "job_id": result.job_id,
                        "deduplicated": result.deduplicated,
                    }
                if args.json:
                    print(json.dumps(row, separators=(",", ":")))
                elif "rejected" in row:
                    print(f"line {number}: {row['id']} rejected: {row['rejected']}")
                else:
                    dedup = " (deduplicated: not enqueued again)" if result.deduplicated else ""
                    print(f"line {number}: {row['id']} -> {result.job_id}{dedup}")
        if rejected:
            raise RefusedError(f"{rejected} of {len(jobs)} job(s) rejected")

    return _run(args, go)
