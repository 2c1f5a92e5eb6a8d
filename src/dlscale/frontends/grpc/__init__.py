"""The Open Inference Protocol over gRPC (KServe v2, with Triton's additions)."""

from dlscale.frontends.grpc.frontend import GrpcFrontend

__all__ = ["GrpcFrontend"]
