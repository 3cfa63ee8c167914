"""`sepp-log`: operator commands over a sepp data directory.

    sepp-log verify DATA_DIR
    sepp-log dump   DATA_DIR [--from-seq N] [--to-seq N] [--since T] [--until T]
                             [--queue Q] [--job ID] [--type NAME[,NAME]] [--follow]
    sepp-log replay DATA_DIR [--until-seq N | --until-time T] [--into NEW_DIR]
    sepp-log audit  DATA_DIR JOB_ID | --key QUEUE IDEMPOTENCY_KEY | --queue Q --since T [--until T]
                    | --admin [--since T] [--until T] [--actor NAME] [--action PREFIX]
    sepp-log stats  DATA_DIR [--rows N]
    sepp-log repair DATA_DIR (--truncate-at SEQ | --set-aside-history) [--backup-dir DIR] [--dry-run]

Every command takes `--json` (JSON lines on stdout, each with a "type") and
`--no-progress`. Times (T) are ISO-8601; a time without a zone is UTC; times are
printed as ISO-8601 UTC. A progress bar is drawn on stderr only when stderr is a
terminal.

Exit codes: 0 success (warnings, such as a torn tail that recovery would truncate,
do not fail a run); 1 problems found (damage, a snapshot that disagrees with the
log, a request the data cannot satisfy); 2 usage error.

Every command only reads the data directory -- it works on a stopped server's
directory and, read-only, on a running server's -- except `repair`, which changes
it (and must only be run on a stopped server's directory).

Owns: argument parsing, exit codes and the wiring of each command to its module
(`tools.verify`, `tools.dump`, `tools.replay`, `tools.audit`, `tools.stats`,
`tools.repair`). Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

from sepp.storage.engine import LOCK_FILE
from sepp.storage.fs import DataDirLocked

from .audit import (
    admin_actions,
    audit_jobs,
    emit_admin,
    emit_histories,
    emit_transitions,
    queue_transitions,
)
from .datadir import ERROR, DataDir, Problem, open_data_dir
from .dump import DumpFilter, EventLine, dump
from .events import parse_types
from .output import (
    Emitter,
    Progress,
    UsageError,
    format_bytes,
    format_time_ms,
    parse_time,
)
from .repair import (
    apply_repair,
    apply_set_aside,
    default_backup_dir,
    lock_data_dir,
    plan_repair,
    plan_set_aside,
)
from .replay import (
    check_copy,
    check_target,
    emit_state,
    replay_to,
    seq_at_time,
    write_into,
)
from .stats import collect_stats, emit_stats
from .verify import emit_report, verify

__all__ = ["build_parser", "main"]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2


def _progress(
    args: argparse.Namespace, label: str, total: int, *, streams: bool = False
) -> Progress:
    """A progress bar when stderr is a terminal -- and, for a command that streams
    its output (`streams`), stdout is not: its output is progress enough."""
    enabled = not args.no_progress and sys.stderr.isatty()
    if streams and sys.stdout.isatty():
        enabled = False
    return Progress(label, total, enabled=enabled)


def _problem_printer(out: Emitter) -> Callable[[Problem], None]:
    def emit(problem: Problem) -> None:
        out.emit("problem", problem.human(), problem.data())

    return emit


# ---------------------------------------------------------------- commands


def _verify(args: argparse.Namespace) -> int:
    data_dir = open_data_dir(args.data_dir)
    progress = _progress(args, "verify", data_dir.log_bytes)
    out = Emitter(json_lines=args.json, progress=progress)
    out.note(
        f"verifying {data_dir.root}: {len(data_dir.segments)} segments "
        f"({format_bytes(data_dir.log_bytes)}), {len(data_dir.snapshots)} snapshots"
    )
    report = verify(data_dir, on_problem=_problem_printer(out), on_bytes=progress.advance)
    progress.finish()
    emit_report(report, out)
    return report.exit_code


def _dump(args: argparse.Namespace) -> int:
    data_dir = open_data_dir(args.data_dir)
    filt = DumpFilter(
        from_seq=args.from_seq,
        to_seq=args.to_seq,
        since_ms=parse_time(args.since) if args.since else None,
        until_ms=parse_time(args.until) if args.until else None,
        queue=args.queue,
        job=args.job,
        types=parse_types(args.type) if args.type else None,
    )
    if filt.from_seq is not None and filt.to_seq is not None and filt.from_seq > filt.to_seq:
        raise UsageError("--from-seq is after --to-seq")
    progress = _progress(args, "dump", data_dir.log_bytes, streams=True)
    if args.follow:
        progress.enabled = False
    out = Emitter(json_lines=args.json, progress=progress)

    def on_event(line: EventLine) -> None:
        # Only the form that is printed is built (a dump is long).
        if args.json:
            out.emit("event", None, line.data())
        else:
            out.emit("event", line.human(), {})

    def follow() -> bool:
        out.flush()
        time.sleep(args.poll_interval)
        return True

    result = dump(
        data_dir,
        filt,
        on_event=on_event,
        on_problem=_problem_stream(args, "dump", progress),
        follow=follow if args.follow else None,
        on_bytes=progress.advance,
    )
    progress.finish()
    return result.exit_code


def _replay(args: argparse.Namespace) -> int:
    data_dir = open_data_dir(args.data_dir)
    if args.into:
        check_target(args.into)
    out = Emitter(json_lines=args.json)
    errors = _problem_stream(args, "replay")
    until_seq = args.until_seq
    if args.until_time is not None:
        until_ms = parse_time(args.until_time)
        until_seq, problems = seq_at_time(data_dir, until_ms)
        for problem in problems:
            errors(problem)
        if until_seq is None:
            return EXIT_PROBLEMS
        out.note(f"the last record at or before {format_time_ms(until_ms)} is seq {until_seq}")
    progress = _progress(args, "replay", data_dir.log_bytes)
    out.progress = progress
    result = replay_to(data_dir, until_seq=until_seq, on_bytes=progress.advance)
    progress.finish()
    for problem in result.problems:
        errors(problem)
    state = result.state
    if state is None:
        return EXIT_PROBLEMS
    emit_state(result, state, out)
    if args.into:
        written = write_into(result, args.into)
        mismatch = check_copy(result, args.into)
        if mismatch is not None:
            errors(mismatch)
            return EXIT_PROBLEMS
        out.emit(
            "into",
            f"wrote {args.into}: {', '.join(written) or 'an empty log'}; it replays to the "
            f"same state (sepp serve --data-dir {args.into} starts from seq {result.seq})",
            {"dir": args.into, "files": written, "seq": result.seq, "checked": True},
        )
    return EXIT_OK if result.ok else EXIT_PROBLEMS


def _audit(args: argparse.Namespace) -> int:
    chosen = sum(x is not None for x in (args.job_id, args.key, args.queue)) + bool(args.admin)
    if chosen != 1:
        raise UsageError(
            "give exactly one of JOB_ID, --key QUEUE KEY, --queue Q --since T or --admin"
        )
    if args.queue is not None and args.since is None:
        raise UsageError("--queue needs --since T")
    if args.queue is None and not args.admin and (args.since is not None or args.until is not None):
        raise UsageError("--since and --until go with --queue or --admin")
    if not args.admin and (args.actor is not None or args.action is not None):
        raise UsageError("--actor and --action go with --admin")
    if args.admin:
        data_dir = open_data_dir(args.data_dir)
        progress = _progress(args, "audit", data_dir.log_bytes)
        out = Emitter(json_lines=args.json, progress=progress)
        errors = _problem_stream(args, "audit")
        actions = admin_actions(
            data_dir,
            since_ms=parse_time(args.since) if args.since else None,
            until_ms=parse_time(args.until) if args.until else None,
            actor=args.actor,
            action_prefix=args.action,
            on_bytes=progress.advance,
        )
        progress.finish()
        for problem in actions.problems:
            errors(problem)
        emit_admin(actions, out)
        return actions.exit_code
    data_dir = open_data_dir(args.data_dir)
    progress = _progress(args, "audit", data_dir.log_bytes)
    out = Emitter(json_lines=args.json, progress=progress)
    errors = _problem_stream(args, "audit")
    if args.queue is not None:
        since_ms = parse_time(args.since)
        until_ms = parse_time(args.until) if args.until else None
        summary = queue_transitions(
            data_dir, args.queue, since_ms=since_ms, until_ms=until_ms, on_bytes=progress.advance
        )
        progress.finish()
        for problem in summary.problems:
            errors(problem)
        emit_transitions(summary, out)
        return summary.exit_code
    result = audit_jobs(
        data_dir,
        job_id=args.job_id,
        key=(args.key[0], args.key[1]) if args.key else None,
        on_bytes=progress.advance,
    )
    progress.finish()
    for problem in result.problems:
        errors(problem)
    emit_histories(result, out, key=args.key)
    return result.exit_code


def _stats(args: argparse.Namespace) -> int:
    data_dir = open_data_dir(args.data_dir)
    progress = _progress(args, "stats", data_dir.log_bytes)
    out = Emitter(json_lines=args.json, progress=progress)
    errors = _problem_stream(args, "stats")
    stats = collect_stats(data_dir, on_bytes=progress.advance)
    progress.finish()
    for problem in stats.problems:
        errors(problem)
    emit_stats(stats, out, rows_max=args.rows)
    return stats.exit_code


def _set_aside_history(args: argparse.Namespace) -> int:
    data_dir = open_data_dir(args.data_dir)
    out = Emitter(json_lines=args.json)
    errors = _problem_stream(args, "repair")
    plan = plan_set_aside(data_dir)
    for problem in plan.damaged:
        errors(problem)
    for problem in plan.other:
        errors(
            Problem(
                problem.severity,
                problem.kind,
                problem.file,
                problem.offset,
                problem.seq,
                f"{problem.reason} (not history: setting history aside leaves it; "
                "recovery still refuses -- see --truncate-at)",
            )
        )
    lock = _lock_for_change(args, plan.changes_anything, data_dir, errors)
    if lock is None:
        return EXIT_PROBLEMS
    backup = args.backup_dir or default_backup_dir(data_dir)
    steps = plan.describe()
    out.emit(
        "repair-plan",
        "set damaged history aside" + ("" if steps else ": none found; nothing to change"),
        {
            "set_aside_history": True,
            "history_end": plan.history_end,
            "steps": steps,
            "backup_dir": backup,
            "dry_run": args.dry_run,
        },
    )
    for step in steps:
        out.note(("  would " if args.dry_run else "  ") + step)
    if args.dry_run or not plan.changes_anything:
        return EXIT_PROBLEMS if plan.other else EXIT_OK
    try:
        done = apply_set_aside(plan, backup)
    finally:
        os.close(lock)
    out.emit(
        "repair-done",
        f"done; the damaged history is in {backup} (REPAIR.txt says how to undo). "
        f"Check with: sepp-log verify {data_dir.root}",
        {"backup_dir": backup, "done": done},
    )
    return EXIT_PROBLEMS if plan.other else EXIT_OK


def _lock_for_change(
    args: argparse.Namespace,
    changes_anything: bool,
    data_dir: DataDir,
    errors: Callable[[Problem], None],
) -> int | None:
    """The data directory's lock held while repair changes it (a running server
    appends to the log being changed), -1 when nothing will change, None (the
    problem reported) when a server holds it."""
    if args.dry_run or not changes_anything:
        return -1
    try:
        return lock_data_dir(data_dir)
    except DataDirLocked as exc:
        errors(Problem(ERROR, "locked", LOCK_FILE, 0, None, f"{exc}: stop it first"))
        return None


def _repair(args: argparse.Namespace) -> int:
    if args.set_aside_history:
        return _set_aside_history(args)
    data_dir = open_data_dir(args.data_dir)
    out = Emitter(json_lines=args.json)
    errors = _problem_stream(args, "repair")
    plan = plan_repair(data_dir, args.truncate_at)
    if plan.refusal is not None:
        errors(plan.refusal)
        return EXIT_PROBLEMS
    # A running server appends to the log being cut: hold its lock while changing it.
    lock = _lock_for_change(args, plan.changes_anything, data_dir, errors)
    if lock is None:
        return EXIT_PROBLEMS
    backup = args.backup_dir or default_backup_dir(data_dir)
    steps = plan.describe()
    header = (
        f"cut at seq {args.truncate_at}: keep records up to seq {args.truncate_at - 1} ({plan.why})"
    )
    out.emit(
        "repair-plan",
        header + ("" if steps else "; nothing to change"),
        {
            "truncate_at": args.truncate_at,
            "keep_through": args.truncate_at - 1,
            "why": plan.why,
            "steps": steps,
            "backup_dir": backup,
            "dry_run": args.dry_run,
        },
    )
    for step in steps:
        out.note(("  would " if args.dry_run else "  ") + step)
    if args.dry_run or not plan.changes_anything:
        return EXIT_OK
    try:
        done = apply_repair(plan, backup)
    finally:
        os.close(lock)
    out.emit(
        "repair-done",
        f"done; backup in {backup} (REPAIR.txt says how to undo). "
        f"Check with: sepp-log verify {data_dir.root}",
        {"backup_dir": backup, "done": done},
    )
    return EXIT_OK


def _problem_stream(
    args: argparse.Namespace, command: str, progress: Progress | None = None
) -> Callable[[Problem], None]:
    """Problems of a command whose stdout is data: stderr in human mode, stdout
    objects in JSON mode."""
    errors = Emitter(
        json_lines=args.json, stream=sys.stdout if args.json else sys.stderr, progress=progress
    )

    def emit(problem: Problem) -> None:
        errors.emit("problem", f"sepp-log {command}: {problem.human()}", problem.data())

    return emit


# ---------------------------------------------------------------- parser


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a sequence number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a sequence number is not negative: {text!r}")
    return value


def _positive(text: str) -> int:
    value = _seq(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("must be between 0 and 3600 seconds")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data_dir", metavar="DATA_DIR", help="the server's data directory")
    parser.add_argument("--json", action="store_true", help="JSON lines on stdout")
    parser.add_argument(
        "--no-progress", action="store_true", help="never draw a progress bar on stderr"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sepp-log",
        description="Read, check and repair a sepp data directory (read-only unless told).",
        epilog="Exit codes: 0 success, 1 problems found, 2 usage error.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    verify_cmd = sub.add_parser(
        "verify",
        help="check every segment and snapshot: checksums, sequence, decoding, a full replay",
        description="Check headers, both checksums of every record, sequence continuity, "
        "that every envelope decodes and every event applies (a full replay), and that "
        "every snapshot equals the replayed state at its sequence number. A torn tail "
        "that recovery would truncate is a warning (exit 0); anything recovery refuses "
        "is an error (exit 1).",
    )
    _common(verify_cmd)
    verify_cmd.set_defaults(func=_verify)

    dump_cmd = sub.add_parser(
        "dump",
        help="print records and their events, streaming, with filters",
        description="Print every event of the log (one line each, or JSON lines), in "
        "constant memory. Filters combine: an event is printed when it passes all.",
    )
    _common(dump_cmd)
    dump_cmd.add_argument("--from-seq", type=_seq, metavar="N", help="first record (inclusive)")
    dump_cmd.add_argument("--to-seq", type=_seq, metavar="N", help="last record (inclusive)")
    dump_cmd.add_argument("--since", metavar="T", help="records at or after time T (ISO-8601)")
    dump_cmd.add_argument("--until", metavar="T", help="records at or before time T (ISO-8601)")
    dump_cmd.add_argument("--queue", metavar="Q", help="events of jobs in queue Q")
    dump_cmd.add_argument("--job", metavar="JOB_ID", help="events of one job")
    dump_cmd.add_argument(
        "--type", metavar="NAMES", help="event types, comma-separated (e.g. JobAcked,JobNacked)"
    )
    dump_cmd.add_argument(
        "--follow", action="store_true", help="keep printing as a live server appends"
    )
    dump_cmd.add_argument(
        "--poll-interval",
        type=_seconds,
        default=0.5,
        metavar="S",
        help="with --follow: seconds between looks at the log (default 0.5)",
    )
    dump_cmd.set_defaults(func=_dump)

    replay_cmd = sub.add_parser(
        "replay",
        help="the state at a point of the log; --into writes a data directory cut there",
        description="Rebuild the state after a record (or at a time) and print, per queue, "
        "ready, scheduled, in-flight and dead jobs, the oldest ready job's age and the "
        "leases outstanding. --into NEW_DIR writes a new data directory holding the log "
        "cut at that point, which `sepp serve` starts from (point-in-time recovery).",
    )
    _common(replay_cmd)
    point = replay_cmd.add_mutually_exclusive_group()
    point.add_argument("--until-seq", type=_seq, metavar="N", help="after record N (inclusive)")
    point.add_argument(
        "--until-time", metavar="T", help="after the last record at or before time T (ISO-8601)"
    )
    replay_cmd.add_argument(
        "--into", metavar="NEW_DIR", help="write a new data directory (absent or empty) cut there"
    )
    replay_cmd.set_defaults(func=_replay)

    audit_cmd = sub.add_parser(
        "audit",
        help="the whole history of a job, or the transitions of a queue over a period",
        description="Every event of one job (by id, or by queue and idempotency key) with "
        "its time, attempt, lease deadline, worker, nack reason and dead-letter cause, "
        "and its current state; or, with --queue and --since, the count of each kind "
        "of transition of the queue's jobs over the period.",
    )
    _common(audit_cmd)
    audit_cmd.add_argument("job_id", metavar="JOB_ID", nargs="?", help="the job's id")
    audit_cmd.add_argument(
        "--key",
        nargs=2,
        metavar=("QUEUE", "IDEMPOTENCY_KEY"),
        help="the job(s) enqueued in QUEUE with this idempotency key",
    )
    audit_cmd.add_argument("--queue", metavar="Q", help="summarise the transitions of queue Q")
    audit_cmd.add_argument("--since", metavar="T", help="with --queue: from time T (ISO-8601)")
    audit_cmd.add_argument("--until", metavar="T", help="with --queue: to time T (ISO-8601)")
    audit_cmd.add_argument(
        "--admin",
        action="store_true",
        help="list the operators' actions (actor, role, action, reason, queue, ids); "
        "--since/--until, --actor NAME and --action PREFIX narrow it",
    )
    audit_cmd.add_argument("--actor", metavar="NAME", help="with --admin: only this actor's")
    audit_cmd.add_argument(
        "--action",
        metavar="PREFIX",
        help="with --admin: actions starting so (queue., jobs.cancel)",
    )
    audit_cmd.set_defaults(func=_audit)

    stats_cmd = sub.add_parser(
        "stats",
        help="segments, bytes, records, events by type, time range and event rate",
        description="Count what the log holds and draw the per-minute event rate.",
    )
    _common(stats_cmd)
    stats_cmd.add_argument(
        "--rows",
        type=_positive,
        default=60,
        metavar="N",
        help="histogram rows at most (longer ranges average several minutes a row; default 60)",
    )
    stats_cmd.set_defaults(func=_stats)

    repair_cmd = sub.add_parser(
        "repair",
        help="cut the log at SEQ, or set damaged history aside (operator repairs); server stopped",
        description="--truncate-at SEQ: keep records 1..SEQ-1 and remove record SEQ and "
        "everything after it (and every snapshot of a later state), moving what is removed "
        "into a backup directory with a note on how to undo. Refuses (exit 1) when the "
        "result would not start: damage before SEQ, SEQ past the end or before the start of "
        "the log, no snapshot to cover a log that starts after seq 1; or when SEQ lies in "
        "damaged history that --set-aside-history handles. --set-aside-history: move damaged "
        "segments wholly below the snapshot recovery starts from, and the segments before "
        "them, into the backup directory; no snapshot and no later record is touched. "
        "The server must be stopped.",
    )
    repair_cmd.add_argument("data_dir", metavar="DATA_DIR", help="the server's data directory")
    what = repair_cmd.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--truncate-at",
        type=_positive,
        metavar="SEQ",
        help="the first record to remove",
    )
    what.add_argument(
        "--set-aside-history",
        action="store_true",
        help="move damaged history (wholly below the snapshot recovery starts from) aside",
    )
    repair_cmd.add_argument(
        "--backup-dir",
        metavar="DIR",
        help="where removed data goes (default DATA_DIR/repair-backup-<UTC time>)",
    )
    repair_cmd.add_argument(
        "--dry-run", action="store_true", help="say what would be done; change nothing"
    )
    repair_cmd.add_argument("--json", action="store_true", help="JSON lines on stdout")
    repair_cmd.set_defaults(func=_repair, no_progress=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with code 2 on a usage error
    handler: Callable[[argparse.Namespace], int] = args.func
    try:
        code = handler(args)
        sys.stdout.flush()
        return code
    except UsageError as exc:
        print(f"sepp-log {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`sepp-log dump ... | head`): not an error. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
