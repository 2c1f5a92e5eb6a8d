"""Wire frontends over the DataPlane: Open Inference Protocol REST (http) and gRPC (grpc)."""

#: Seconds the requests in flight get when a frontend stops, unless told otherwise (`--grace-s`).
GRACE_S = 10.0
