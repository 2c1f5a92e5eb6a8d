"""The PyTorch backend: one package, one module per concern (files, precision, CUDA, buckets)."""

from dlscale.backends.torch.backend import TorchBackend

__all__ = ["TorchBackend"]
