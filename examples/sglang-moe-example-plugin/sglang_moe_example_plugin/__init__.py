"""An example third-party kernel plugin for sglang-moe-plugins (see README.md)."""

from .plugin import ExampleTorchPlugin

__all__ = ["ExampleTorchPlugin"]
