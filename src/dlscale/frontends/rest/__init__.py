"""The Open Inference Protocol over REST: transport (HTTP), routes (api) and tensors (codec)."""

from dlscale.frontends.rest.transport import HttpFrontend

__all__ = ["HttpFrontend"]
