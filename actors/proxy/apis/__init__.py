"""RocketMQ 5's gRPC protocol, `apache.rocketmq.v2`: the .proto files of Apache rocketmq-apis at
commit 3e60073 (github.com/apache/rocketmq-apis, "feat: add deployment and lite topic fields to
Admin service (#116)"), under protos/, and the modules scripts/gen-grpc generated from them
(grpcio-tools 1.85.1). Regenerate, never edit, the *_pb2*.py files."""
