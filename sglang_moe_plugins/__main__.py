"""``python -m sglang_moe_plugins ...``: the ``sglang-moe-plugins`` command (``--version``, ``doctor``, ...)."""

import sys

from .cli import main

__all__: list[str] = []

if __name__ == "__main__":  # importing this module (e.g. to check the package's imports) runs nothing
    sys.exit(main())
