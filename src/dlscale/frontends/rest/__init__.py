"""The Open Inference Protocol over REST: transport (HTTP), routes (api), answers (render)."""

from dlscale.frontends.rest.transport import HttpFrontend

__all__ = ["HttpFrontend"]
