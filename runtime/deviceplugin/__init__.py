"""The kubelet device-plugin API (v1beta1) without generated code.

Why: plugins under test and the kubelet stand-in speak it on the node, where only the
standard library and Debian 12's python3-grpcio (1.51) can be counted on; protoc output
would tie us to a protobuf runtime. `v1beta1.proto` is the schema for humans and for
cross-checks; `messages` holds the same schema as field tables, `wire` encodes and decodes
them, `grpc_api` serves and calls the two services with grpcio's generic handlers.
"""
