"""API keys: the hello decides; a failed hello closes the connection; health needs
no key."""

from __future__ import annotations

import pytest

from tests.server.conftest import RawClient, connect, job

ONE_KEY = {"SEPP_AUTH__API_KEYS": '[{name="a", key="s3cret"}]'}
TWO_KEYS = {"SEPP_AUTH__API_KEYS": '[{name="a", key="s3cret"}, {name="b", key="other-key"}]'}
DENY_ALL = {"SEPP_AUTH__API_KEYS": "[]"}


async def failed_hello(address: str, api_key: str | None) -> RawClient:
    client = await RawClient.connect(address)
    body = {"protocol": 1}
    if api_key is not None:
        body["api_key"] = api_key
    response = await client.call("hello", body)
    assert response.status == "unauthenticated", response
    assert isinstance(response.body["message"], str)
    # The key is never echoed back.
    if api_key:
        assert api_key not in response.body["message"]
    await client.wait_closed()
    return client


@pytest.mark.parametrize("api_key", [None, "wrong", "s3cre", "s3cret ", ""])
async def test_a_hello_without_the_right_key_is_unauthenticated_and_closes(server_factory, api_key):
    server = server_factory(env=ONE_KEY)
    await failed_hello(server.address, api_key)
    # The server itself is fine.
    client = await connect(server.address, api_key="s3cret")
    assert (await client.ok("health"))["status"] == "serving"


async def test_the_right_key_opens_every_operation(server_factory, queue_names):
    server = server_factory(env=TWO_KEYS)
    q = next(queue_names)
    for key in ("s3cret", "other-key"):
        client = await RawClient.connect(server.address)
        hello = await client.hello(api_key=key)
        assert hello["auth_required"] is True
        (job_id,) = await client.enqueue_ids(job(q))
        (delivered,) = await client.reserve([q])
        assert delivered["id"] == job_id
        assert (await client.ack(delivered)).status == "ok"


async def test_plain_string_keys_are_accepted_too(server_factory):
    server = server_factory(env={"SEPP_AUTH__API_KEYS": '["plain-key"]'})
    await connect(server.address, api_key="plain-key")
    await failed_hello(server.address, "other")


async def test_an_empty_key_list_denies_everyone(server_factory):
    server = server_factory(env=DENY_ALL)
    for key in (None, "s3cret", "anything"):
        await failed_hello(server.address, key)


@pytest.mark.parametrize("env", [ONE_KEY, DENY_ALL], ids=["one-key", "deny-all"])
async def test_health_works_without_a_key(server_factory, env):
    server = server_factory(env=env)
    client = await RawClient.connect(server.address)
    assert await client.ok("health") == {"status": "serving"}
    assert await client.ok("health") == {"status": "serving"}


async def test_operations_before_a_successful_hello_are_refused(server_factory, queue_names):
    server = server_factory(env=ONE_KEY)
    client = await RawClient.connect(server.address)
    response = await client.call("enqueue", {"jobs": [job(next(queue_names))]})
    assert response.status == "invalid_argument"
    await client.wait_closed()
    checker = await connect(server.address, api_key="s3cret")
    assert (await checker.ok("queue_stats", {}))["queues"] == []


async def test_requests_pipelined_behind_a_failed_hello_are_not_executed(
    server_factory, queue_names
):
    server = server_factory(env=ONE_KEY)
    q = next(queue_names)
    client = await RawClient.connect(server.address)
    hello = client.send("hello", {"protocol": 1, "api_key": "wrong"})
    client.send("enqueue", {"jobs": [job(q)]})
    assert (await client.response(hello)).status == "unauthenticated"
    await client.wait_closed()
    assert [r.id for r in client.arrivals] == [hello]
    checker = await connect(server.address, api_key="s3cret")
    assert (await checker.stats(q))["ready"] == 0


async def test_without_configured_keys_any_key_or_none_is_accepted(sepp_server):
    for key in (None, "whatever"):
        client = await RawClient.connect(sepp_server.address)
        assert (await client.hello(api_key=key))["auth_required"] is False
