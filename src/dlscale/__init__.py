"""dlscale: deep-learning inference at scale, measured."""

__version__ = "0.1.0"
