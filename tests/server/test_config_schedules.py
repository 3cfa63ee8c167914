"""[[schedules]] in the configuration (issue 17 item 2): one test per check of
sepp/server/config.py `_schedule_entries`, and hot reload: a table added is put,
a changed one updated keeping its anchor, a removed one deleted (actor `config`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sepp.core.config import ConfigError
from sepp.server.config import example_config, load_config
from sepp.server.reload import plan_reload
from tests.inprocess import in_process
from tests.server.test_reload import in_process_config_from, in_process_reloader, write_config

pytestmark = pytest.mark.usefixtures("in_process_env")

BEAT = '[[schedules]]\nname = "beat"\nqueue = "q"\njob_type = "tick"\nevery_ms = 60000\n'
NIGHTLY = (
    '[[schedules]]\nname = "nightly"\nqueue = "q"\njob_type = "digest"\ncron = "0 2 * * *"\n'
    'timezone = "Europe/Berlin"\npayload = "{}"\nencoding = "application/json"\n'
    'catch_up = "none"\n'
)


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "sepp.toml"
    path.write_text(text)
    return load_config(str(path), env={})


def refused(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as excinfo:
        load(tmp_path, text)
    return excinfo.value


def test_schedule_tables_are_read_with_their_settings(tmp_path: Path) -> None:
    config = load(tmp_path, BEAT + NIGHTLY)
    names = [s["name"] for s in config.schedules]  # type: ignore[attr-defined]
    assert names == ["beat", "nightly"]
    assert config.schedules[1]["timezone"] == "Europe/Berlin"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[[schedules]]\nqueue = "q"\njob_type = "t"\nevery_ms = 1000\n', "schedules[0].name"),
        (BEAT + BEAT, "schedules.beat.name"),
        ('[[schedules]]\nname = "x"\njob_type = "t"\nevery_ms = 1000\n', "schedules.x.queue"),
        (BEAT + "colour = 3\n", "schedules.beat.colour"),
        (BEAT.replace("60000", '"60000"'), "schedules.beat.every_ms"),
        (BEAT + 'cron = "* * * * *"\n', "schedules.beat"),
        (BEAT.replace("every_ms = 60000", 'cron = "61 * * * *"'), "schedules.beat.cron"),
        (BEAT + 'timezone = "Mars/Olympus"\n', "schedules.beat.timezone"),
        (BEAT + 'catch_up = "some"\n', "schedules.beat.catch_up"),
    ],
)
def test_a_bad_schedule_table_is_refused_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    assert refused(tmp_path, text).key == key


def test_the_example_configurations_schedule_is_valid(tmp_path: Path) -> None:
    text = example_config()
    block = text[text.index("# [[schedules]]") :]
    toml = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    (entry,) = load(tmp_path, toml).schedules  # type: ignore[attr-defined]
    assert entry["cron"] == "0 2 * * *" and entry["timezone"] == "Europe/Berlin"


def test_a_reload_plan_names_changed_schedules(tmp_path: Path) -> None:
    running = load(tmp_path, BEAT)
    loaded = load(tmp_path, BEAT + NIGHTLY)
    plan = plan_reload(running, loaded)  # type: ignore[arg-type]
    assert "schedules" in plan.changed
    assert [s["name"] for s in plan.config.schedules] == ["beat", "nightly"]


async def test_schedules_from_the_file_are_put_at_start_and_follow_reloads(tmp_path: Path) -> None:
    path = tmp_path / "sepp.toml"
    write_config(path, BEAT)
    async with in_process(in_process_config_from(path)) as server:
        state = server.service.engine.state
        assert set(state.schedules) == {"beat"}
        anchor = state.schedules["beat"].next_ms
        write_config(path, BEAT.replace('"tick"', '"tock"') + NIGHTLY)
        assert in_process_reloader(server, path).reload()
        assert set(state.schedules) == {"beat", "nightly"}
        assert state.schedules["beat"].spec.job_type == "tock"
        assert state.schedules["beat"].next_ms == anchor  # same timing: same anchor
        write_config(path, NIGHTLY)
        assert in_process_reloader(server, path).reload()
        assert set(state.schedules) == {"nightly"}


def test_a_schedule_payload_without_an_encoding_is_plain_text(tmp_path: Path) -> None:
    config = load(tmp_path, BEAT + 'payload = "hello"\n')
    (beat,) = config.schedules  # type: ignore[attr-defined]
    assert beat["encoding"] == "text/plain; charset=utf-8"
    assert "encoding" not in load(tmp_path, BEAT).schedules[0]  # type: ignore[attr-defined]


async def test_a_configured_schedule_with_a_text_payload_and_no_encoding_is_created(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sepp.toml"
    write_config(path, BEAT + 'payload = "hello"\n')
    async with in_process(in_process_config_from(path)) as server:
        assert "beat" in server.engine.state.schedules
