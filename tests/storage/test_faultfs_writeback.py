"""The fake file system's power loss with out-of-order writeback
(`FaultyFileSystem.crash(pages=True)`, `faultfs.writeback_pages`): unsynced pages
reach the disk independently -- whole, not at all, or torn -- and synced bytes are
never touched."""

from __future__ import annotations

import itertools
import random

from sepp.storage.faultfs import PAGE_BYTES, SECTOR_BYTES, FaultyFileSystem, writeback_pages

PATH = "/d/log"


def written_over_synced_zeros(pages: int) -> tuple[FaultyFileSystem, bytes, bytes]:
    """A file of synced zeros (preallocated space), then `pages` pages of data
    written over it, unsynced. Returns the fs, the synced and the written content."""
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    handle = fs.create(PATH)
    fs.write_at(handle, b"H" * 100, 0)
    fs.write_zeros(handle, 100, pages * PAGE_BYTES + 500)
    fs.fsync(handle)
    fs.fsync_dir("/d")
    synced = fs.read(PATH)
    data = bytes((n % 251) + 1 for n in range(pages * PAGE_BYTES - 300))  # never zero
    fs.write_at(handle, data, 100)
    return fs, synced, fs.read(PATH)


def page_fates(synced: bytes, current: bytes, after: bytes) -> list[str]:
    """For each page: "kept", "lost", or "torn" (each sector new or as synced)."""
    fates = []
    for start in range(0, len(current), PAGE_BYTES):
        new, old, got = (b[start : start + PAGE_BYTES] for b in (current, synced, after))
        if got == new:
            fates.append("kept" if new != old else "same")
        elif got == old:
            fates.append("lost")
        else:
            for at in range(0, len(got), SECTOR_BYTES):
                sector = got[at : at + SECTOR_BYTES]
                assert sector in (new[at : at + SECTOR_BYTES], old[at : at + SECTOR_BYTES]), (
                    f"sector at {start + at} is neither as written nor as synced"
                )
            fates.append("torn")
    return fates


def test_a_power_cut_keeps_unsynced_pages_out_of_order(rng: random.Random) -> None:
    seen: set[tuple[str, str]] = set()
    for _ in range(60):
        fs, synced, current = written_over_synced_zeros(pages=4)
        fs.crash(random.Random(rng.getrandbits(64)), pages=True)
        after = fs.read(PATH)
        assert len(after) == len(synced)  # the size was synced with the zeros
        assert after[:100] == synced[:100]  # synced bytes are never touched
        fates = page_fates(synced, current, after)
        seen.update(itertools.pairwise(fates))
    # A lost or torn page before a kept one: the hole recovery must handle.
    assert ("lost", "kept") in seen and ("torn", "kept") in seen, seen


def test_without_pages_a_power_cut_keeps_nothing_unsynced() -> None:
    fs, synced, _current = written_over_synced_zeros(pages=3)
    fs.crash(random.Random(1))
    assert fs.read(PATH) == synced


def test_a_grown_file_may_keep_its_new_size_without_its_data(rng: random.Random) -> None:
    sizes = set()
    for _ in range(40):
        durable = b"S" * 1000
        current = durable + b"N" * (3 * PAGE_BYTES)
        out = writeback_pages(durable, current, [(1000, current[1000:])], rng)
        assert len(durable) <= len(out) <= len(current)
        assert out[:1000] == durable
        for start in range(1000, len(out)):
            assert out[start] in (0, ord("N"))  # new data, or zeros never written
        sizes.add(len(out))
    assert len(durable) in sizes and len(current) in sizes
