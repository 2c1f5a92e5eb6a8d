"""Wire frontends over the DataPlane: Open Inference Protocol REST (http) and gRPC (grpc)."""
