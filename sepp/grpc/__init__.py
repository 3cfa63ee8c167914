"""The gRPC `sepp.v1` front: the official sepp clients (sepp-py, sepp-rs, code
generated from the `sepp.v1` protocol) against this server, unchanged.

A thin adapter over the service layer (ARCHITECTURE.md, "Front ends and the
service layer"), on `grpc.aio` in the server's own event loop next to the native
listener: front.py (the listener, the RPCs, the status-code table, auth, health),
convert.py (protobuf messages to the core's commands and back), v1/ (the generated
messages of proto/sepp/v1/queue.proto), gen.py (regenerates v1/).

Needs the optional extra `sepp[grpc]` (grpcio, grpcio-health-checking, protobuf);
the server imports this package only when `[grpc] listen_addr` is set.

gRPC's fork support stays off: the server forks to write snapshots, and the gRPC
core's fork handlers (pthread_atfork) would run in that child and could deadlock
it. It is off by default in current grpcio, but grpc/grpc#41768 plans to turn it
on by default, so it is set off here, before `grpc` is first imported.

Must not import: another front end (sepp.server.server, the native wire, the admin
front), storage, the native protocol, the client library.
"""

from __future__ import annotations

import os

# Read by the gRPC core when `grpc` is first imported (so: before any import of it).
FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"
os.environ[FORK_SUPPORT_ENV] = "false"
