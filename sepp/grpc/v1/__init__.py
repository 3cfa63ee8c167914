"""Generated code of `sepp.v1` (sepp/grpc/proto/sepp/v1/queue.proto): messages only
(the service is registered by hand in sepp/grpc/front.py). Checked in; regenerate
with `python -m sepp.grpc.gen` after editing the .proto (tests/grpc/test_proto.py
checks the two agree)."""
