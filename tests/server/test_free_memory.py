"""Freed memory goes back to the system (issue 13, found 4): after 100k distinct
queues were churned through a server and forgotten, glibc kept the free pages
between live chunks resident (90 MiB for an idle size of 29). `gcpolicy.refreeze`,
which the server runs every few seconds, now releases them."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

import pytest

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


class _Node:
    """A connection-like object: it refers to something that refers back to it."""

    def __init__(self) -> None:
        self.peer: object = [self]


def _frozen_cycle() -> weakref.ref[_Node]:
    node = _Node()
    gc.freeze()  # frozen while alive, as a connection is at a refreeze
    return weakref.ref(node)  # the last strong reference goes with this frame


def test_a_cycle_frozen_while_alive_is_reclaimed_by_the_next_refreeze_of_a_small_heap() -> None:
    # issue 13: 171 connections refused before hello stayed resident (15 MiB) for
    # good, each held in a cycle by the exception that closed it after a refreeze
    # had frozen it alive.
    ref = _frozen_cycle()
    try:
        assert ref() is not None  # garbage, but frozen: no collection sees it
        gc.collect()
        assert ref() is not None
        done = gcpolicy.refreeze(sweep_blocks_max=sys.getallocatedblocks() + 1_000_000)
        assert done == gcpolicy.SWEPT
        assert ref() is None
    finally:
        gc.unfreeze()


def test_a_large_heap_is_not_swept_whole_and_its_young_cycles_are_collected_before_freezing() -> (
    None
):
    ref = _frozen_cycle()
    young = _Node()
    young_ref = weakref.ref(young)
    del young
    try:
        done = gcpolicy.refreeze(sweep_blocks_max=0, young_collect_max=10_000_000)
        assert done == gcpolicy.YOUNG_COLLECTED
        assert young_ref() is None  # collected, not frozen
        assert ref() is not None  # the documented trade of a large heap
        done = gcpolicy.refreeze(sweep_blocks_max=0, young_collect_max=-1)
        assert done == gcpolicy.FROZEN_ONLY
    finally:
        gc.unfreeze()
        gc.collect()
    assert ref() is None


def test_the_small_heap_sweep_also_runs_without_pymalloc() -> None:
    # The server's default allocator is jemalloc (PYTHONMALLOC=malloc), under which
    # pymalloc's block count is 0: the refreeze must size the heap another way and
    # still sweep a small one, or frozen connection cycles are never reclaimed.
    code = (
        "import gc, sys, weakref\n"
        "from sepp.server import gcpolicy\n"
        "from tests.server.test_free_memory import _frozen_cycle\n"
        "assert sys.getallocatedblocks() == 0\n"
        "ref = _frozen_cycle()\n"
        "gc.collect()\n"
        "assert ref() is not None\n"
        "print(gcpolicy.heap_size() > 0, gcpolicy.refreeze(), ref() is None)\n"
    )
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", gcpolicy.SWEPT, "True"]


def test_refreeze_gives_freed_pages_back_on_jemalloc() -> None:
    # On jemalloc (the server's default allocator, told never to purge by itself)
    # the refreeze purges every arena: the same 64 MiB heap as above comes back.
    from sepp.server.allocator import JEMALLOC_CONF, find_jemalloc

    library = find_jemalloc()
    if library is None:
        pytest.skip("libjemalloc is not installed (apt install libjemalloc2)")
    code = (
        "from sepp.server.allocator import jemalloc_version\n"
        "from tests.server.test_free_memory import "
        "test_refreeze_gives_the_free_pages_of_the_heap_back_to_the_system as check\n"
        "assert jemalloc_version() is not None\n"
        "check()\n"
        "print('released')\n"
    )
    env = {
        **os.environ, "PYTHONMALLOC": "malloc", "LD_PRELOAD": library, "MALLOC_CONF": JEMALLOC_CONF
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["released"]
