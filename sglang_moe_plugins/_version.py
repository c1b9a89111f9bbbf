"""Package and plugin-contract versions."""

__all__ = ["__version__", "CONTRACT_VERSION"]

__version__ = "0.1.0"

#: Version of the kernel-plugin contract (``Plugin``, ``Support``, the op shape/config/input/output
#: types). A plugin may declare ``contract_version`` (an int); the registry skips a plugin whose
#: version differs from this one.
CONTRACT_VERSION = 1
