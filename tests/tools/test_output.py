"""The shared formats of `sepp-log` (ISO-8601 UTC times in and out, sizes,
durations) and the progress bar, which draws only on a terminal."""

from __future__ import annotations

import io

import pytest

from tools.output import (
    Emitter,
    Progress,
    UsageError,
    format_bytes,
    format_duration_ms,
    format_time_ms,
    parse_time,
)

T0 = 1_700_000_000_000


def test_times_print_as_iso_8601_utc_with_milliseconds() -> None:
    assert format_time_ms(T0) == "2023-11-14T22:13:20.000Z"
    assert format_time_ms(T0 + 7) == "2023-11-14T22:13:20.007Z"
    assert format_time_ms(0) == "1970-01-01T00:00:00.000Z"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2023-11-14T22:13:20Z", T0),
        ("2023-11-14T22:13:20.123Z", T0 + 123),
        ("2023-11-14T22:13:20", T0),  # no zone: UTC
        ("2023-11-14 22:13:20", T0),
        ("2023-11-14T23:13:20+01:00", T0),
        ("2023-11-14T17:13:20-05:00", T0),
        ("2023-11-14", T0 - (22 * 3600 + 13 * 60 + 20) * 1000),
        (" 2023-11-14T22:13:20Z ", T0),
    ],
)
def test_times_parse_from_iso_8601_with_or_without_a_zone(text: str, ms: int) -> None:
    assert parse_time(text) == ms


@pytest.mark.parametrize("text", ["yesterday", "1700000000000", "2023-13-01", ""])
def test_a_time_that_is_not_iso_8601_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="not an ISO-8601 time"):
        parse_time(text)


def test_sizes_and_durations_read_naturally() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 2**30)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "5.0 GiB",
    ]
    assert [format_duration_ms(ms) for ms in (850, 12_500, 187_000, 7_500_000, 300_000_000)] == [
        "850ms",
        "12.5s",
        "3m07s",
        "2h05m",
        "3d11h",
    ]
    assert format_duration_ms(-1500) == "-1.5s"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_and_erases_itself() -> None:
    terminal = _Terminal()
    progress = Progress("verify", 1000, stream=terminal, interval_s=0.0, width=10)
    assert progress.enabled
    progress.advance(500)
    assert terminal.getvalue().startswith("\r\x1b[Kverify [#####-----]  50%  500 B / 1000 B")
    progress.finish()
    assert terminal.getvalue().endswith("\r\x1b[K")


def test_progress_bar_writes_nothing_when_not_on_a_terminal() -> None:
    pipe = io.StringIO()
    progress = Progress("verify", 1000, stream=pipe, interval_s=0.0)
    assert not progress.enabled
    progress.advance(1000)
    progress.finish()
    assert pipe.getvalue() == ""


def test_emitter_erases_the_bar_before_a_line_and_writes_json_lines() -> None:
    terminal = _Terminal()
    progress = Progress("dump", 10, stream=terminal, interval_s=0.0, width=4)
    human = Emitter(json_lines=False, stream=terminal, progress=progress)
    progress.advance(5)
    human.emit("event", "hello", {"x": 1})
    human.note("note")
    assert terminal.getvalue().endswith("\r\x1b[Khello\nnote\n")
    out = io.StringIO()
    machine = Emitter(json_lines=True, stream=out)
    machine.emit("event", "hello", {"x": 1})
    machine.note("not in JSON")
    assert out.getvalue() == '{"type": "event", "x": 1}\n'
