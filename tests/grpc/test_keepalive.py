"""The official clients ping every 30 s, also while idle (keepalive_time_ms 30000,
permit_without_calls). The gRPC core's server defaults count such pings as abuse
(pings without calls refused: at most one every 2 hours while idle, 2 strikes) and
answer the fourth with GOAWAY "too_many_pings", dropping the connection after
~120 s idle. The front's settings accept them: a channel with the official
client's options idles for over 2 minutes and its connection never leaves READY.

Marked `grpc_long` (it idles on purpose for IDLE_S): SEPP_GRPC_LONG_TESTS=0
deselects it, which .ci/run's second pass sets, so it runs once per CI run.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from sepp.grpc.v1 import queue_pb2 as pb
from tests.grpc.conftest import OFFICIAL_CHANNEL_OPTIONS, Stub, grpc_address, grpc_server

pytestmark = [pytest.mark.usefixtures("in_process_env"), pytest.mark.grpc_long]

# The default policy (grpc core's ping abuse policy): an idle transport's first
# ping is free, each later one within min_recv_ping_interval is a strike, and the
# strike past max_ping_strikes (2) closes the connection: the 4th ping, at ~120 s.
# Over 4 ping intervals, with slack for the client's timer.
IDLE_S = 135.0


async def test_an_idle_channel_with_the_official_clients_keepalive_stays_connected():
    async with (
        grpc_server() as server,
        grpc.aio.insecure_channel(
            grpc_address(server), options=OFFICIAL_CHANNEL_OPTIONS
        ) as channel,
    ):
        stub = Stub(channel)
        await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        changes: list[grpc.ChannelConnectivity] = []

        async def watch() -> None:
            state = channel.get_state()
            while True:
                await channel.wait_for_state_change(state)
                state = channel.get_state()
                changes.append(state)

        watcher = asyncio.ensure_future(watch())
        try:
            # Idling is what this test tests: no call for IDLE_S, only pings.
            await asyncio.sleep(IDLE_S)
        finally:
            watcher.cancel()
        assert changes == [], f"the connection left READY while idle: {changes}"
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert info.server_version
