"""FORMAT.md is the specification; these tests keep its generated parts -- the event
catalogue and the example hex dump -- identical to the code, and check its worked
checksum example. On failure the message holds the text to paste."""

from __future__ import annotations

import re
from pathlib import Path

import log_format
from log_format import CATALOGUE, COMMAND_ACK, encode_envelope, encode_record, encode_segment_header

FORMAT_MD = Path(log_format.__file__).with_name("FORMAT.md")


def section(name: str) -> str:
    text = FORMAT_MD.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {name}:begin[^>]*-->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert match, f"FORMAT.md lacks the {name} markers"
    return match.group(1)


def render_catalogue() -> str:
    out = []
    for spec in CATALOGUE:
        out += [
            f"### {spec.type_id} {spec.name} (version {spec.version})",
            "",
            spec.meaning,
            "",
            "| index | field | type | meaning |",
            "| --- | --- | --- | --- |",
            f"| 0 | type_id | `int` | {spec.type_id} |",
            f"| 1 | version | `int` | {spec.version} |",
        ]
        out += [
            f"| {i} | `{field.name}` | `{field.type}` | {field.meaning} |"
            for i, field in enumerate(spec.fields, start=2)
        ]
        out.append("")
    return "\n".join(out)


def render_hexdump(data: bytes) -> str:
    lines = ["```"]
    for pos in range(0, len(data), 16):
        chunk = data[pos : pos + 16]
        cells = [f"{b:02x}" for b in chunk] + ["  "] * (16 - len(chunk))
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{pos:08x}  {' '.join(cells[:8])}  {' '.join(cells[8:])}  |{text}|")
    lines += ["```", ""]
    return "\n".join(line.rstrip() for line in lines)


def one_record_segment() -> bytes:
    # The same bytes as test_records.test_one_record_segment_golden_bytes.
    event = [3, 1, "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", 1, "worker-1"]
    body = encode_envelope(1_700_000_000_000, COMMAND_ACK, [event])
    return encode_segment_header(1) + encode_record(1, 1, body)


def test_format_md_catalogue_matches_the_catalogue_data() -> None:
    expected = render_catalogue()
    assert section("catalogue") == expected, "paste into FORMAT.md:\n" + expected


def test_format_md_hexdump_is_the_golden_one_record_segment() -> None:
    expected = render_hexdump(one_record_segment())
    assert section("hexdump") == expected, "paste into FORMAT.md:\n" + expected


def test_format_md_states_the_worked_checksum_example() -> None:
    text = FORMAT_MD.read_text(encoding="utf-8")
    for value in ("0xE3069283", "0x2507C60D", "0xC78AB0E5", "e5 b0 8a c7", "0x4F006462"):
        assert value in text
