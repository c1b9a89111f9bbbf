"""``python -m sglang_moe_plugins.cli ...``: the ``sglang-moe-plugins`` command."""

import sys

from . import main

sys.exit(main())
