"""The Open Inference Protocol's gRPC schema (inference.proto) and its generated stubs."""
