"""Auth (`authorization: Bearer <key>` on every QueueService call; missing or
unknown -> UNAUTHENTICATED), TLS from the native listener's settings, and the
standard health service, outside auth (sepp-semantics.md §19, §20).
"""

from __future__ import annotations

import shutil

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sepp.grpc.front import SERVICE_NAME
from sepp.grpc.v1 import queue_pb2 as pb
from tests.grpc.conftest import (
    enqueue_one,
    grpc_address,
    grpc_server,
    job,
    status_of_call,
    stub_for,
)
from tests.support import self_signed_certificate

pytestmark = pytest.mark.usefixtures("in_process_env")

KEYS = "alice s3cret-alice\nbob s3cret-bob\n"


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    return str(path)


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def test_every_call_without_a_known_bearer_key_is_unauthenticated(keys_file):
    async with (
        grpc_server(auth__api_keys_file=keys_file) as server,
        stub_for(grpc_address(server)) as stub,
    ):
        request = pb.EnqueueBatchRequest(jobs=[job("q")])
        for metadata in (
            (),
            bearer("wrong"),
            (("authorization", "Basic s3cret-alice"),),
            (("authorization", "s3cret-alice"),),
        ):
            code, _ = await status_of_call(stub.EnqueueBatch(request, metadata=metadata))
            assert code == grpc.StatusCode.UNAUTHENTICATED, metadata
        for call in (
            stub.GetServerInfo(pb.GetServerInfoRequest()),
            stub.Reserve(pb.ReserveRequest(queues=["q"])),
            stub.DrainDeadLetters(pb.DrainDeadLettersRequest()),
        ):
            assert (await status_of_call(call))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert server.service.queue_stats(["q"])[1][0].ready == 0
        for key in ("s3cret-alice", "s3cret-bob"):
            response = await stub.EnqueueBatch(request, metadata=bearer(key))
            assert response.results[0].WhichOneof("outcome") == "success"
            # The scheme is case-insensitive, as HTTP's are.
            response = await stub.EnqueueBatch(
                request, metadata=(("authorization", f"bearer {key}"),)
            )
            assert response.results[0].WhichOneof("outcome") == "success"


async def test_health_answers_serving_without_a_key():
    async with (
        grpc_server() as server,
        grpc.aio.insecure_channel(grpc_address(server)) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        code, _ = await status_of_call(
            health.Check(health_pb2.HealthCheckRequest(service="other.Service"))
        )
        assert code == grpc.StatusCode.NOT_FOUND
        server.service.stopping = True  # shutdown began
        try:
            answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        finally:
            server.service.stopping = False
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_health_needs_no_key_when_keys_are_configured(keys_file):
    async with (
        grpc_server(auth__api_keys_file=keys_file) as server,
        grpc.aio.insecure_channel(grpc_address(server)) as channel,
    ):
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    where = tmp_path_factory.mktemp("tls")
    return self_signed_certificate(where / "cert.pem", where / "key.pem")


async def test_tls_settings_of_the_native_listener_secure_the_grpc_front(certificate, keys_file):
    cert, key = certificate
    async with grpc_server(
        server__tls_cert_path=str(cert),
        server__tls_key_path=str(key),
        auth__api_keys_file=keys_file,
    ) as server:
        address = grpc_address(server)
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with stub_for(address, credentials=credentials) as stub:
            job_id = await enqueue_one_with_key(stub, "s3cret-alice")
            assert job_id
            code, _ = await status_of_call(
                stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q")]))
            )
            assert code == grpc.StatusCode.UNAUTHENTICATED
        # Plaintext against the TLS port never gets an answer.
        async with stub_for(address) as plain:
            code, _ = await status_of_call(
                plain.GetServerInfo(pb.GetServerInfoRequest(), metadata=bearer("s3cret-alice"),
                                    timeout=5)
            )  # fmt: skip
            assert code == grpc.StatusCode.UNAVAILABLE


async def enqueue_one_with_key(stub, key: str) -> str:
    response = await stub.EnqueueBatch(
        pb.EnqueueBatchRequest(jobs=[job("q")]), metadata=bearer(key)
    )
    result = response.results[0]
    assert result.WhichOneof("outcome") == "success"
    return str(result.success.job_id)


async def test_an_open_server_lets_every_call_in():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        assert await enqueue_one(stub, job("q"))
