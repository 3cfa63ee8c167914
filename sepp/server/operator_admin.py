"""The admin commands of the `sepp` CLI (issue 15; schedules: issue 17), over the
Python client's admin methods (PROTOCOL.md 5.14-5.32):

    sepp jobs get ID
    sepp jobs list QUEUE --state ready|scheduled|inflight|dead_letter
                   [--limit N] [--cursor C] [--all] [--cause C]
    sepp jobs cancel QUEUE ID ... --yes [--reason R]
    sepp dead-letters list [--queue Q] [--cause C] [--limit N] [--cursor C] [--all]
    sepp dead-letters show ID
    sepp dead-letters requeue QUEUE (ID ... | --all | --cause C) [--reason R]
    sepp dead-letters delete QUEUE (ID ... | --all | --cause C) --yes [--reason R]
    sepp dead-letters drain ...     (sepp/server/operator_drain.py)
    sepp queues list
    sepp queues pause|resume Q [--reason R]
    sepp queues purge Q --yes [--reason R]
    sepp queues create Q [--max-attempts N --retry-delay-ms N ...] [--reason R]
    sepp queues update Q [--max-attempts N ...] [--unset KEY ...] [--reason R]
    sepp queues delete Q --yes [--reason R]
    sepp schedules list
    sepp schedules create NAME --queue Q --job-type T (--cron C [--timezone TZ] | --every-ms N)
                   [--payload TEXT --encoding E --priority N --max-attempts N
                    --catch-up none|one|all] [--reason R]
    sepp schedules pause|resume NAME [--reason R]
    sepp schedules delete NAME --yes [--reason R]

Options common to all (`--addr`, TLS, the API key, `--json`) and the exit codes
are those of sepp/server/operator.py. Every change is a logged command: the
server records it in the audit trail (`sepp-log audit --admin`) with the actor
its API key gives the connection (PROTOCOL.md 5.14), the role, the affected ids
and `--reason`.

Guard rails: the commands that delete jobs for good (`jobs cancel`,
`dead-letters delete`, `queues purge`, `queues delete`) need `--yes` (exit 2
without it). Commands naming ids with a QUEUE act only on ids of that queue: an
id of another queue is reported `not_found` and left alone. A bulk command
exits 1 when an id was not done (not found, wrong state), after reporting every
outcome. By filter (`--all`, `--cause`) the server works in bounded chunks
(1,000 a call); the command repeats the call until nothing matches.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sepp.core.state import QUEUE_OVERRIDE_KEYS
from sepp.server.operator import RefusedError, _common, _run

JOB_STATES = ("ready", "scheduled", "inflight", "dead_letter")
DEAD_LETTER_CAUSES = ("attempts_exhausted", "rejected", "lease_expired", "admin")
# Ids per admin call: the protocol's cap (PROTOCOL.md 5.14).
ADMIN_IDS_PER_CALL_MAX = 1000
# Jobs per listing call: the protocol's cap on `limit`.
LIST_LIMIT_MAX = 1000
LIST_LIMIT_DEFAULT = 100
# Characters of a payload or reason shown in a table.
TABLE_TEXT_CHARS_MAX = 40


# -- the JSON of a job (also the drain's line format) -------------------------------------


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def job_doc(info: Any) -> dict[str, Any]:
    """A client `JobInfo` as JSON: every field, the payload as base64 with its
    encoding (content type), times as ISO 8601 UTC. It carries all an enqueue
    needs to make the job again (`sepp enqueue --from-jsonl`)."""
    payload = info.payload
    trace = info.trace_context
    return {
        "id": info.job_id,
        "queue": info.queue,
        "job_type": info.job_type,
        "state": info.state,
        "priority": info.priority,
        "attempt": info.attempt,
        "max_attempts": info.max_attempts,
        "payload": None
        if payload is None
        else {
            "encoding": payload.encoding,
            "data_base64": base64.b64encode(payload.data).decode("ascii"),
        },
        "idempotency_key": info.idempotency_key,
        "custom": dict(info.custom),
        "trace_context": None
        if trace is None
        else {"traceparent": trace.traceparent, "tracestate": trace.tracestate},
        "enqueued_at": _when(info.enqueued_at),
        "scheduled_at": _when(info.scheduled_at),
        "run_at": _when(info.run_at),
        "lease_expires_at": _when(info.lease_expires_at),
        "worker_id": info.worker_id,
        "last_reason": info.last_reason,
        "dead_letter_cause": info.dead_letter_cause,
        "failed_at": _when(info.failed_at),
        "final_attempt": info.final_attempt,
    }


def _json_line(doc: Any) -> None:
    import json

    print(json.dumps(doc, separators=(",", ":")))


def _payload_text(info: Any) -> str:
    payload = info.payload
    if payload is None:
        return ""
    try:
        text = payload.data.decode()
    except UnicodeDecodeError:
        return f"<{len(payload.data)} bytes {payload.encoding}>"
    return text if text.isprintable() else repr(text)


def _cut(text: str | None, chars: int = TABLE_TEXT_CHARS_MAX) -> str:
    if not text:
        return ""
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _render_job(doc: dict[str, Any], info: Any) -> None:
    for key, value in doc.items():
        if key == "payload":
            value = (
                None if info.payload is None else f"{info.payload.encoding}: {_payload_text(info)}"
            )
        if value is None or value == {}:
            continue
        print(f"{key:18} {value}")


JOB_TABLE_HEADER = (
    f"{'id':26} {'queue':16} {'state':11} {'type':16} {'pri':>3} {'att':>3} "
    f"{'cause':18} {'last reason'}"
)


def _job_row(info: Any) -> str:
    return (
        f"{info.job_id:26} {_cut(info.queue, 16):16} {info.state:11} "
        f"{_cut(info.job_type, 16):16} {info.priority:>3} "
        f"{info.final_attempt or info.attempt:>3} {info.dead_letter_cause or '':18} "
        f"{_cut(info.last_reason)}"
    )


# -- arguments -----------------------------------------------------------------------------


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= LIST_LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"must be from 1 to {LIST_LIMIT_MAX}, got {value}")
    return value


def _without_yes(args: argparse.Namespace, name: str, what: str) -> bool:
    """True (and one line on stderr) when a destructive command lacks --yes: it
    then stops before connecting, exit 2."""
    if args.yes:
        return False
    print(f"sepp {name}: {what} for good: add --yes to go ahead", file=sys.stderr)
    return True


def _chunks(ids: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), ADMIN_IDS_PER_CALL_MAX):
        yield ids[start : start + ADMIN_IDS_PER_CALL_MAX]


async def _ids_of_queue(client: Any, queue: str, ids: list[str], state: str | None) -> set[str]:
    """The ids of `ids` that are jobs of `queue` (and in `state`, when given).
    A job's queue never changes, so the answer stays true while the command
    runs."""
    infos = await asyncio.gather(*(client.get_job(job_id) for job_id in dict.fromkeys(ids)))
    return {
        info.job_id
        for info in infos
        if info is not None and info.queue == queue and (state is None or info.state == state)
    }


async def _by_ids(
    client: Any, queue: str, ids: list[str], state: str | None, call: Any, reason: str | None
) -> list[tuple[str, str]]:
    """Outcomes of `call(ids, reason=...)` for the ids of `queue`, in the order
    asked; the others are `not_found` and are never sent."""
    ours = await _ids_of_queue(client, queue, ids, state)
    sent = [job_id for job_id in ids if job_id in ours]
    done: dict[str, str] = {}
    for chunk in _chunks(sent):
        answer = await call(chunk, reason=reason)
        done.update(answer.outcomes)
    return [(job_id, done.get(job_id, "not_found")) for job_id in ids]


def _report_outcomes(args: argparse.Namespace, what: str, outcomes: list[tuple[str, str]]) -> None:
    """Print per-id outcomes; raise RefusedError (exit 1) when one was not done."""
    done = sum(1 for _, outcome in outcomes if outcome == "done")
    if args.json:
        import json

        doc = {
            "outcomes": [{"id": job_id, "outcome": outcome} for job_id, outcome in outcomes],
            "done": done,
        }
        print(json.dumps(doc, indent=2))
    else:
        for job_id, outcome in outcomes:
            print(f"{job_id} {outcome}")
        print(f"{what} {done} of {len(outcomes)}")
    if done != len(outcomes):
        raise RefusedError(f"{len(outcomes) - done} of {len(outcomes)} id(s) not {what}")


# -- jobs ----------------------------------------------------------------------------------


def _jobs_get(args: argparse.Namespace) -> int:
    async def go(client: Any) -> None:
        info = await client.get_job(args.id)
        if info is None:
            raise RefusedError(f"no job {args.id} (never enqueued, or gone)")
        _show(args, info)

    return _run(args, go)


def _show(args: argparse.Namespace, info: Any) -> None:
    doc = job_doc(info)
    if args.json:
        import json

        print(json.dumps(doc, indent=2))
    else:
        _render_job(doc, info)


async def _list_pages(
    args: argparse.Namespace, client: Any, queues: list[str], state: str, cause: str | None
) -> None:
    """Print the jobs of `queues` in `state`, page by page: JSON lines or a
    table. Without --all, at most --limit jobs, then the cursor of the rest."""
    budget = None if args.all else args.limit
    shown = 0
    if not args.json:
        print(JOB_TABLE_HEADER)
    cursor = args.cursor
    for queue in queues:
        while budget is None or shown < budget:
            limit = args.limit if budget is None else min(args.limit, budget - shown)
            page = await client.list_jobs(queue, state, cursor=cursor, limit=limit, cause=cause)
            for info in page.jobs:
                _json_line(job_doc(info)) if args.json else print(_job_row(info))
            shown += len(page.jobs)
            cursor = page.next_cursor
            if cursor is None:
                break
        if cursor is not None:
            # Stopped at --limit with more to come: say how to go on.
            more = f"--queue {queue} " if args.command == "dead-letters" else ""
            print(f"sepp: more jobs: {more}--cursor {cursor}", file=sys.stderr)
            return
        if budget is not None and shown >= budget and queue != queues[-1]:
            rest = " ".join(queues[queues.index(queue) + 1 :])
            print(f"sepp: more jobs in queue(s): {rest}", file=sys.stderr)
            return
    if not args.json:
        print(f"({shown} job(s))")


def _jobs_list(args: argparse.Namespace) -> int:
    if args.all and args.cursor is not None:
        print("sepp jobs list: give --all or --cursor, not both", file=sys.stderr)
        return 2
    if args.cause is not None and args.state != "dead_letter":
        print("sepp jobs list: --cause needs --state dead_letter", file=sys.stderr)
        return 2
    return _run(
        args, lambda client: _list_pages(args, client, [args.queue], args.state, args.cause)
    )


def _jobs_cancel(args: argparse.Namespace) -> int:
    if _without_yes(args, "jobs cancel", "cancel deletes the jobs"):
        return 2

    async def go(client: Any) -> None:
        outcomes = await _by_ids(
            client, args.queue, args.ids, None, client.cancel_jobs, args.reason
        )
        _report_outcomes(args, "cancelled", outcomes)

    return _run(args, go)


# -- dead letters --------------------------------------------------------------------------


def _dead_list(args: argparse.Namespace) -> int:
    if args.cursor is not None and args.queue is None:
        print("sepp dead-letters list: --cursor needs --queue", file=sys.stderr)
        return 2
    if args.all and args.cursor is not None:
        print("sepp dead-letters list: give --all or --cursor, not both", file=sys.stderr)
        return 2

    async def go(client: Any) -> None:
        if args.queue is not None:
            queues = [args.queue]
        else:
            queues = [q.name for q in await client.list_queues() if q.dead_letter > 0]
        await _list_pages(args, client, queues, "dead_letter", args.cause)

    return _run(args, go)


def _dead_show(args: argparse.Namespace) -> int:
    async def go(client: Any) -> None:
        info = await client.get_job(args.id)
        if info is None or info.state != "dead_letter":
            raise RefusedError(f"no dead letter {args.id}")
        _show(args, info)

    return _run(args, go)


def _dead_by(args: argparse.Namespace, requeue: bool) -> int:
    verb = "requeued" if requeue else "deleted"
    by_filter = args.all or args.cause is not None
    if bool(args.ids) == by_filter:
        print(
            f"sepp dead-letters {args.dead_command}: give ids, or --all / --cause (not both)",
            file=sys.stderr,
        )
        return 2
    if not requeue and _without_yes(args, "dead-letters delete", "delete removes dead letters"):
        return 2

    async def go(client: Any) -> None:
        call = client.requeue_dead_letters if requeue else client.delete_dead_letters
        if args.ids:
            outcomes = await _by_ids(client, args.queue, args.ids, "dead_letter", call, args.reason)
            _report_outcomes(args, verb, outcomes)
            return
        total = 0
        while True:
            answer = await call(queue=args.queue, cause=args.cause, reason=args.reason)
            total += len(answer.done)
            if answer.remaining == 0 or not answer.outcomes:
                break
        if args.json:
            import json

            print(json.dumps({"queue": args.queue, "cause": args.cause, verb: total}, indent=2))
        else:
            print(f"{verb} {total} dead letter(s) of {args.queue}")

    return _run(args, go)


# -- queues --------------------------------------------------------------------------------


def _queue_doc(q: Any) -> dict[str, Any]:
    return {
        "name": q.name,
        "declared": q.declared,
        "paused": q.paused,
        "ready": q.ready,
        "scheduled": q.scheduled,
        "inflight": q.inflight,
        "dead_letter": q.dead_letter,
        "settings": q.settings,
        "overrides": q.overrides,
    }


def _queues_list(args: argparse.Namespace) -> int:
    async def go(client: Any) -> None:
        queues = await client.list_queues()
        if args.json:
            for q in queues:
                _json_line(_queue_doc(q))
            return
        print(
            f"{'queue':24} {'paused':6} {'ready':>9} {'scheduled':>9} {'inflight':>9} "
            f"{'dead':>9}  overrides"
        )
        for q in queues:
            overrides = " ".join(f"{k}={v}" for k, v in sorted((q.overrides or {}).items()))
            print(
                f"{q.name:24} {'yes' if q.paused else 'no':6} {q.ready:>9} {q.scheduled:>9} "
                f"{q.inflight:>9} {q.dead_letter:>9}  {overrides}"
            )
        if not queues:
            print("(no queues)")

    return _run(args, go)


def _render_change(change: Any) -> None:
    state = "paused" if change.paused else "delivering"
    print(f"{change.queue}: {state}{'' if change.changed else ' (already)'}")


def _queues_pause(args: argparse.Namespace) -> int:
    pause = args.sub_command == "pause"

    async def go(client: Any) -> Any:
        call = client.pause_queue if pause else client.resume_queue
        return await call(args.queue, reason=args.reason)

    return _run(args, go, _render_change)


def _queues_purge(args: argparse.Namespace) -> int:
    if _without_yes(args, "queues purge", "purge deletes the ready and scheduled jobs"):
        return 2

    async def go(client: Any) -> dict[str, Any]:
        purged = 0
        while True:
            answer = await client.purge_queue(args.queue, reason=args.reason)
            purged += answer.purged
            if answer.remaining == 0 or answer.purged == 0:
                return {"queue": args.queue, "purged": purged, "remaining": answer.remaining}

    return _run(
        args,
        go,
        lambda r: print(f"{r['queue']}: purged {r['purged']} job(s), {r['remaining']} left"),
    )


def _overrides_given(args: argparse.Namespace) -> dict[str, int | str]:
    return {
        key: getattr(args, key) for key in QUEUE_OVERRIDE_KEYS if getattr(args, key) is not None
    }


def _render_put(result: Any) -> None:
    what = "created" if result.created else "updated" if result.changed else "unchanged"
    print(f"{result.queue}: {what}")
    for key, value in sorted(result.settings.items()):
        print(f"  {key:26} {value}")


def _queues_create(args: argparse.Namespace) -> int:
    from sepp.client import QueueNotFoundError

    async def go(client: Any) -> Any:
        try:
            info = await client.queue_info(args.queue)
        except QueueNotFoundError:
            info = None
        if info is not None and info.overrides is not None:
            raise RefusedError(f"queue {args.queue} is already defined at runtime: use update")
        return await client.put_queue(args.queue, _overrides_given(args), reason=args.reason)

    return _run(args, go, _render_put)


def _queues_update(args: argparse.Namespace) -> int:
    async def go(client: Any) -> Any:
        # put_queue replaces the runtime overrides: merge the given ones into the
        # current ones (a concurrent update between the read and the put is lost).
        info = await client.queue_info(args.queue)
        overrides = dict(info.overrides or {})
        for key in args.unset:
            overrides.pop(key, None)
        overrides.update(_overrides_given(args))
        return await client.put_queue(args.queue, overrides, reason=args.reason)

    return _run(args, go, _render_put)


def _queues_delete(args: argparse.Namespace) -> int:
    if _without_yes(args, "queues delete", "delete removes the queue with its waiting jobs"):
        return 2

    async def go(client: Any) -> Any:
        return await client.delete_queue(args.queue, reason=args.reason)

    def render(result: Any) -> None:
        kept = " (declared by the file: only its runtime overrides went)"
        print(
            f"{result.queue}: deleted, {result.cancelled} job(s) cancelled"
            f"{kept if result.declared_by_file else ''}"
        )

    return _run(args, go, render)


# -- schedules (issue 17) ------------------------------------------------------------------

CATCH_UP_POLICIES = ("none", "one", "all")


def _schedule_doc(s: Any) -> dict[str, Any]:
    return {
        "name": s.name,
        "queue": s.queue,
        "job_type": s.job_type,
        "cron": s.cron,
        "timezone": s.timezone,
        "every_ms": s.every_ms,
        "catch_up": s.catch_up,
        "paused": s.paused,
        "next_fire_at": _when(s.next_fire_at),
        "next_ms": s.next_ms,
        "priority": s.priority,
        "max_attempts": s.max_attempts,
        "payload_encoding": s.payload_encoding,
        "created_at": _when(s.created_at),
    }


def _schedules_list(args: argparse.Namespace) -> int:
    async def go(client: Any) -> None:
        schedules = await client.list_schedules()
        if args.json:
            for s in schedules:
                _json_line(_schedule_doc(s))
            return
        print(
            f"{'schedule':24} {'queue':16} {'type':16} {'when':28} {'catch_up':8} "
            f"{'paused':6} next fire (UTC)"
        )
        for s in schedules:
            when = f"{s.cron} {s.timezone}" if s.cron is not None else f"every {s.every_ms} ms"
            print(
                f"{_cut(s.name, 24):24} {_cut(s.queue, 16):16} {_cut(s.job_type, 16):16} "
                f"{_cut(when, 28):28} {s.catch_up:8} {'yes' if s.paused else 'no':6} "
                f"{_when(s.next_fire_at)}"
            )
        if not schedules:
            print("(no schedules)")

    return _run(args, go)


def _render_schedule(change: Any) -> None:
    if change.next_ms is None:
        print(f"{change.name}: deleted")
        return
    what = "created" if change.created else "updated" if change.changed else "unchanged"
    state = "paused" if change.paused else "firing"
    next_at = datetime.fromtimestamp(change.next_ms / 1000, UTC).isoformat()
    print(f"{change.name}: {what}, {state}, next fire {next_at}")


def _schedules_create(args: argparse.Namespace) -> int:
    if (args.cron is None) == (args.every_ms is None):
        print("sepp schedules create: give --cron or --every-ms (one of them)", file=sys.stderr)
        return 2

    async def go(client: Any) -> Any:
        return await client.put_schedule(
            args.name, args.queue, args.job_type, cron=args.cron, every_ms=args.every_ms,
            timezone=args.timezone, payload=args.payload, encoding=args.encoding,
            priority=args.priority, max_attempts=args.max_attempts, catch_up=args.catch_up,
            reason=args.reason,
        )  # fmt: skip

    return _run(args, go, _render_schedule)


def _schedules_change(args: argparse.Namespace) -> int:
    verb = args.sub_command
    if verb == "delete" and _without_yes(args, "schedules delete", "delete removes the schedule"):
        return 2

    async def go(client: Any) -> Any:
        call = {
            "pause": client.pause_schedule,
            "resume": client.resume_schedule,
            "delete": client.delete_schedule,
        }[verb]
        return await call(args.name, reason=args.reason)

    def render(change: Any) -> None:
        if verb == "delete":
            print(f"{change.name}: deleted")
            return
        state = "paused" if change.paused else "firing"
        print(f"{change.name}: {state}{'' if change.changed else ' (already)'}")

    return _run(args, go, render)


def add_schedule_commands(sub: Any) -> None:
    schedules = sub.add_parser("schedules", help="recurring jobs: list and change schedules")
    schedules_sub = schedules.add_subparsers(dest="sub_command", required=True)
    s_list = schedules_sub.add_parser(
        "list", help="schedules with their next fire time (JSON lines)"
    )
    _common(s_list)
    s_list.set_defaults(func=_schedules_list)
    create = schedules_sub.add_parser(
        "create", help="create a schedule, or update it (same cron/timezone/every: same ticks)"
    )
    create.add_argument("name")
    create.add_argument("--queue", required=True)
    create.add_argument("--job-type", required=True, dest="job_type")
    create.add_argument("--cron", help="5 fields: minute hour day-of-month month day-of-week")
    create.add_argument("--every-ms", dest="every_ms", type=int, metavar="N")
    create.add_argument("--timezone", default="UTC", help="IANA name for --cron (default UTC)")
    create.add_argument("--payload", help="the payload of each job (text)")
    create.add_argument("--encoding", help="the payload's encoding (content type)")
    create.add_argument("--priority", type=int, metavar="N")
    create.add_argument("--max-attempts", dest="max_attempts", type=int, metavar="N")
    create.add_argument(
        "--catch-up",
        dest="catch_up",
        choices=CATCH_UP_POLICIES,
        default="one",
        help="ticks missed while down: none | one (default) | all",
    )
    _reason(create)
    _common(create)
    create.set_defaults(func=_schedules_create)
    for name, helptext, destructive in (
        ("pause", "fire nothing until resumed; durable", False),
        ("resume", "fire again from the next tick (no catch-up)", False),
        ("delete", "remove the schedule; its fired jobs stay (needs --yes)", True),
    ):
        cmd = schedules_sub.add_parser(name, help=helptext)
        cmd.add_argument("name")
        _reason(cmd)
        if destructive:
            _yes(cmd)
        _common(cmd)
        cmd.set_defaults(func=_schedules_change)


# -- wiring --------------------------------------------------------------------------------


def _reason(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reason", help="why: recorded in the audit trail")


def _yes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--yes", action="store_true", help="confirm: this deletes for good")


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=_limit,
        default=LIST_LIMIT_DEFAULT,
        help=f"at most this many jobs (a page, 1..{LIST_LIMIT_MAX}; default {LIST_LIMIT_DEFAULT})",
    )
    parser.add_argument("--cursor", help="go on where a listing stopped (its cursor)")
    parser.add_argument("--all", action="store_true", help="every page")


def _override_flags(parser: argparse.ArgumentParser, update: bool) -> None:
    for key in QUEUE_OVERRIDE_KEYS:
        flags = [f"--{key.replace('_', '-')}"]
        if key == "default_max_attempts":
            flags.append("--max-attempts")
        if key == "retry_backoff":
            parser.add_argument(*flags, dest=key, choices=("none", "exponential"))
        else:
            parser.add_argument(*flags, dest=key, type=int, metavar="N")
    if update:
        parser.add_argument(
            "--unset",
            action="append",
            default=[],
            choices=QUEUE_OVERRIDE_KEYS,
            metavar="KEY",
            help="drop this runtime override (the file's value applies again)",
        )


def add_admin_commands(sub: Any) -> None:
    from sepp.server.operator_drain import add_drain_command

    jobs = sub.add_parser("jobs", help="inspect and cancel jobs")
    jobs_sub = jobs.add_subparsers(dest="sub_command", required=True)
    get = jobs_sub.add_parser("get", help="a job by id, in any state")
    get.add_argument("id")
    _common(get)
    get.set_defaults(func=_jobs_get)
    listing = jobs_sub.add_parser("list", help="the jobs of a queue in a state (JSON lines)")
    listing.add_argument("queue")
    listing.add_argument("--state", required=True, choices=JOB_STATES)
    listing.add_argument("--cause", choices=DEAD_LETTER_CAUSES, help="dead letters: this cause")
    _paging(listing)
    _common(listing)
    listing.set_defaults(func=_jobs_list)
    cancel = jobs_sub.add_parser("cancel", help="delete ready or scheduled jobs of QUEUE")
    cancel.add_argument("queue")
    cancel.add_argument("ids", nargs="+", metavar="ID")
    _reason(cancel)
    _yes(cancel)
    _common(cancel)
    cancel.set_defaults(func=_jobs_cancel)

    dead = sub.add_parser("dead-letters", help="the dead-letter store")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    dl_list = dead_sub.add_parser("list", help="dead letters, without consuming them")
    dl_list.add_argument("--queue", help="only this queue (default: every queue)")
    dl_list.add_argument("--cause", choices=DEAD_LETTER_CAUSES)
    _paging(dl_list)
    _common(dl_list)
    dl_list.set_defaults(func=_dead_list)
    show = dead_sub.add_parser("show", help="one dead letter by id")
    show.add_argument("id")
    _common(show)
    show.set_defaults(func=_dead_show)
    for name, requeue in (("requeue", True), ("delete", False)):
        cmd = dead_sub.add_parser(
            name,
            help="put dead letters back as ready jobs (same id, attempt 1)"
            if requeue
            else "delete dead letters (needs --yes)",
        )
        cmd.add_argument("queue")
        cmd.add_argument("ids", nargs="*", metavar="ID")
        cmd.add_argument("--all", action="store_true", help="every dead letter of QUEUE")
        cmd.add_argument("--cause", choices=DEAD_LETTER_CAUSES, help="those of this cause")
        _reason(cmd)
        if not requeue:
            _yes(cmd)
        _common(cmd)
        cmd.set_defaults(func=lambda args, requeue=requeue: _dead_by(args, requeue))
    add_drain_command(dead_sub)

    queues = sub.add_parser("queues", help="list and change queues")
    queues_sub = queues.add_subparsers(dest="sub_command", required=True)
    q_list = queues_sub.add_parser("list", help="queues with counts and settings (JSON lines)")
    _common(q_list)
    q_list.set_defaults(func=_queues_list)
    for name, func, helptext, destructive in (
        ("pause", _queues_pause, "deliver nothing (enqueues still land); durable", False),
        ("resume", _queues_pause, "deliver again", False),
        ("purge", _queues_purge, "delete the ready and scheduled jobs (needs --yes)", True),
        ("delete", _queues_delete, "remove a runtime queue definition (needs --yes)", True),
    ):
        cmd = queues_sub.add_parser(name, help=helptext)
        cmd.add_argument("queue")
        _reason(cmd)
        if destructive:
            _yes(cmd)
        _common(cmd)
        cmd.set_defaults(func=func)
    for name, func, update in (("create", _queues_create, False), ("update", _queues_update, True)):
        cmd = queues_sub.add_parser(
            name, help="define a queue at runtime" if not update else "change runtime overrides"
        )
        cmd.add_argument("queue")
        _override_flags(cmd, update)
        _reason(cmd)
        _common(cmd)
        cmd.set_defaults(func=func)
    add_schedule_commands(sub)
