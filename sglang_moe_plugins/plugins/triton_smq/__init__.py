"""The ``triton`` plugin: this project's own Triton kernel for ``silu_mul_quant``.

- :mod:`.plugin`: :class:`~.plugin.TritonPlugin` (answers ``available``/``supports`` without
  importing Triton; ``prepare`` and ``run``),
- :mod:`.kernel`: the ``@triton.jit`` code only,
- :mod:`.tuning`: :class:`~.tuning.KernelConfig` and ``choose_config`` (pure functions of the sizes),
- :mod:`.launch`: the launch plan, the occupancy lookup, ``launch`` (JIT dispatch) and
  ``prepare_launch`` (the prepared launch).

Importing this package imports none of them.
"""

__all__: list[str] = []
