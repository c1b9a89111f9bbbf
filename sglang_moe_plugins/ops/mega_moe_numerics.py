"""The public numerics helpers of op ``mega_moe`` for plugin authors, in one place (docs/authoring.md): its
``__all__`` is covered by the plugin contract version. They are defined in
:mod:`sglang_moe_plugins.ops.mega_moe.formats` (pre-dispatch formats, weight layouts and decoding) and
:mod:`sglang_moe_plugins.ops.mega_moe.reference` (the reference forward); the package's own modules import
them from there."""

from __future__ import annotations

from .mega_moe.formats import *  # noqa: F403
from .mega_moe.formats import __all__ as _formats_all
from .mega_moe.reference import mega_moe_reference

__all__ = [*_formats_all, "mega_moe_reference"]  # noqa: PLE0604 - formats.__all__ is a list of str
