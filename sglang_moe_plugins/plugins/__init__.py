"""Built-in plugins. Each registers through the ``sglang_moe_plugins.kernels`` entry point group."""

__all__: list[str] = []
