"""The peers of sepp's comparative benchmark (benchmarks/compare.py).

Each peer module starts one broker as a child process on 127.0.0.1 (a free port, a
fresh data directory under a temp dir, pinned to core 0), in its durable
(fsync before acknowledging) or buffered configuration, and runs a load driver that
uses the broker's native client (pinned to core 1) with the method of
benchmarks/loadgen.py: closed loop, one request in flight per connection, 256-byte
payloads, enqueue -> drain (reserve + ack, clock stops at the last ack) -> latency.

Every driver prints one JSON line in loadgen's format, so compare.py treats sepp and
the peers alike:

    {"enqueue": {"jobs", "seconds", "jobs_per_s", "client_cpu", "server_cpu"},
     "drain":   {... same ...},
     "latency": {"rounds", "p50_ms", "p99_ms", "p999_ms", "client_cpu", "server_cpu"}}

compare.py's "clients" section uses each peer's ordinary client API instead, from
ONE client process (`nats_client.py`, `beanstalkd_client.py`,
`node/bullmq_client.js`; `Broker.drive_clients`), printing bench_client's format:
``{"producer": {...}, "worker": {...}}`` with jobs/s and the client's CPU per job.

Install everything with `bash benchmarks/peers/install.sh`.
"""
