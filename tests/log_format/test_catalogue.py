"""The event catalogue as data, and `validate_event`'s precise reasons."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from log_format import CATALOGUE, EVENT_SPECS_BY_TYPE, FIELD_TYPES, FormatError, validate_event

JOB = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"

# A value of each field type, and values that type must refuse.
GOOD = {
    "str": ["", "x"],
    "str?": [None, "x"],
    "int": [0, -(2**63), 2**64 - 1],
    "int?": [None, 5],
    "bool": [True, False],
    "bytes?": [None, b"", b"\x00"],
    "map?": [None, {}, {"a": "b", "n": 1, "f": 0.5, "t": True}],
    "strs": [[], ("x",), ["", "y"]],
    "ints": [[], (1,), [0, -(2**62), 2**63 - 1]],
}
BAD = {
    "str": [None, b"x", 1, ["x"]],
    "str?": [b"x", 1, True],
    "int": [None, True, 1.0, "1"],
    "int?": [False, 1.5, "1"],
    "bool": [None, 0, 1, "true"],
    "bytes?": ["x", bytearray(b"x"), 0, [1]],
    "map?": [
        [],
        {1: "int key"},
        {"k": None},
        {"k": [1]},
        {"k": {"nested": 1}},
        {"k": b"bytes"},
        msgpack.ExtType(1, b""),
    ],
    "strs": [None, "x", [1], ["x", None], [b"x"], {"x": "y"}],
    "ints": [None, 1, ["x"], [1, None], [True], [1.5]],
}


def sample(spec: Any) -> list[Any]:
    return [spec.type_id, spec.version, *(GOOD[field.type][-1] for field in spec.fields)]


def test_catalogue_has_twenty_six_events_with_ids_one_to_twenty_six() -> None:
    assert [spec.type_id for spec in CATALOGUE] == list(range(1, 27))
    assert set(EVENT_SPECS_BY_TYPE) == set(range(1, 27))
    assert all(spec.version == 1 for spec in CATALOGUE)


def test_every_field_uses_the_type_language_and_has_a_meaning() -> None:
    assert set(GOOD) == set(BAD) == set(FIELD_TYPES)
    for spec in CATALOGUE:
        assert spec.meaning
        names = [field.name for field in spec.fields]
        assert len(names) == len(set(names)), spec.name
        for field in spec.fields:
            assert field.type in FIELD_TYPES
            assert field.meaning


@pytest.mark.parametrize("spec", CATALOGUE, ids=lambda spec: spec.name)
def test_validate_event_accepts_a_sample_of_each_event(spec: Any) -> None:
    validate_event(sample(spec))
    validate_event(tuple(sample(spec)))


@pytest.mark.parametrize("type_name", sorted(GOOD))
def test_validate_event_accepts_every_good_value_of_each_type(type_name: str) -> None:
    for spec in CATALOGUE:
        for i, field in enumerate(spec.fields):
            if field.type == type_name:
                for value in GOOD[type_name]:
                    event = sample(spec)
                    event[2 + i] = value
                    validate_event(event)


@pytest.mark.parametrize("type_name", sorted(BAD))
def test_validate_event_names_the_field_with_the_wrong_type(type_name: str) -> None:
    checked = 0
    for spec in CATALOGUE:
        for i, field in enumerate(spec.fields):
            if field.type != type_name:
                continue
            for value in BAD[type_name]:
                event = sample(spec)
                event[2 + i] = value
                with pytest.raises(FormatError) as excinfo:
                    validate_event(event)
                assert excinfo.value.reason == f"{spec.name} field {field.name} is not {type_name}"
                checked += 1
    assert checked


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ([], "event is not an array of at least 2 elements"),
        ([3], "event is not an array of at least 2 elements"),
        ("ab", "event is not an array of at least 2 elements"),
        ({0: 3, 1: 1}, "event is not an array of at least 2 elements"),
        ([0, 1], "unknown event type id 0"),
        ([27, 1], "unknown event type id 27"),
        ([True, 1, JOB], "unknown event type id True"),
        (["7", 1, JOB], "unknown event type id '7'"),
        ([7, 2, JOB], "JobPromoted version 2 is not supported (expected 1)"),
        ([7, True, JOB], "JobPromoted version True is not supported (expected 1)"),
        ([7, 1], "JobPromoted has 0 fields, expected 1"),
        ([7, 1, JOB, JOB], "JobPromoted has 2 fields, expected 1"),
        ([3, 1, JOB, 1], "JobAcked has 2 fields, expected 3"),
        ([3, 1, JOB, "1", None], "JobAcked field attempt is not int"),
        ([8, 1, JOB, 1, 1, 0, None, 1], "JobDeadLettered field retained is not bool"),
    ],
)
def test_validate_event_reasons(event: Any, reason: str) -> None:
    with pytest.raises(FormatError) as excinfo:
        validate_event(event)
    assert excinfo.value.reason == reason
