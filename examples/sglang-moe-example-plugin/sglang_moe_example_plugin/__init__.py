"""An example third-party kernel plugin for sglang-moe-plugins (see README.md)."""

from .contig import ExampleTorchContigPlugin
from .mega import ExampleTorchMegaPlugin
from .plugin import ExampleTorchPlugin

__all__ = ["ExampleTorchPlugin", "ExampleTorchMegaPlugin", "ExampleTorchContigPlugin"]
