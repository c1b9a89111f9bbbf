"""Each op's conformance adapter and tolerance policy (``<op>.py``) and its cases and inputs (``<op>_cases.py``).

An op's spec names its adapter (``OpSpec.conformance``); :func:`~sglang_moe_plugins.testing.suite.conformance_for`
imports it on first use. Importing this package imports nothing.
"""

__all__: list[str] = []
