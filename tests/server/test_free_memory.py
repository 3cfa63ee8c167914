"""Freed memory goes back to the system (issue 13, found 4): after 100k distinct
queues were churned through a server and forgotten, glibc kept the free pages
between live chunks resident (90 MiB for an idle size of 29). `gcpolicy.refreeze`,
which the server runs every few seconds, now releases them."""

from __future__ import annotations

import gc
import os

from sepp.server import gcpolicy

MIB = 1024 * 1024


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_refreeze_gives_the_free_pages_of_the_heap_back_to_the_system() -> None:
    if not gcpolicy.can_release_free_memory():  # not glibc: nothing to call
        assert gcpolicy.release_free_memory() is False
        return
    gcpolicy.release_free_memory()
    # 64 MiB of 1 KiB blocks (malloc'd: larger than pymalloc's 512 bytes), with a
    # block that stays alive after every 64 of them, as a live queue or job sits
    # between freed ones: the freed runs cannot shrink the heap from its top.
    held: list[bytearray] = []
    freed: list[bytearray] = []
    for i in range(64 * 1024):
        freed.append(bytearray(1024))
        if i % 64 == 63:
            held.append(bytearray(1024))
    del freed
    gc.collect()
    before = resident_bytes()

    gcpolicy.refreeze()
    gc.unfreeze()  # refreeze also froze this test's objects: leave the collector as it was

    assert before - resident_bytes() > 32 * MIB
    assert len(held) == 1024
