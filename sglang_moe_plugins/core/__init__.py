"""The core: plugin discovery and the registry (:mod:`.registry`, :mod:`.discovery`), the decision for
one key (:mod:`.decide`) and the dispatcher that caches, binds and runs it (:mod:`.dispatcher`,
:mod:`.bound`). Importing this package imports none of them."""

__all__: list[str] = []
