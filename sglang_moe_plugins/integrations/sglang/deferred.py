"""Run the hooking when SGLang's MoE runner is first imported, not in ``load_plugins()``: :func:`when_imported`.

SGLang calls ``load_plugins()`` in every process it starts (launcher, engine, scheduler, detokenizer, DP controller);
only the schedulers ever import its MoE runner. Resolving the hook targets imports that runner stack (thousands of
modules, seconds, hundreds of MB), so :func:`.entry.register` hooks at once only where a watched module is already
imported, and otherwise leaves a finder on ``sys.meta_path`` that watches for the first of them.

The finder wraps the loaders of ``sglang.*`` modules while it waits (any other import is answered ``None`` at once,
so the other finders handle it unchanged; a wrapped module gets its original loader back once it has executed). Once a
watched module has executed, the callback runs when the outermost ``sglang.*`` import of that thread completes: the
callback resolves every hook target, which imports SGLang modules, and inside the import chain some of them are only
partly initialised (``run_mega_routed_experts`` cannot be resolved while ``sglang.srt.layers.quantization.fp8`` is
still importing the runner). The callback runs once per process, under a lock, in the importing thread; the finder then
takes itself off ``sys.meta_path`` before the callback runs (outside the lock: the lock only picks the one thread that
runs it). The callback also runs when the outermost import raised after the watched module had executed, and on the
next ``sglang.*`` import when a finder ahead of this one imported the watched module (its loader never wrapped). A
callback that raises is logged (never raised into the import that triggered it: that import succeeded).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ...log import get_logger

__all__ = ["PendingHooks", "when_imported"]

logger = get_logger(__name__)


class _Loader(importlib.abc.Loader):
    """The loader of a module imported while the finder waits: the original one, counted per thread (the callback runs
    once the outermost of them has executed, in a thread whose chain brought a watched module in)."""

    def __init__(self, loader: Any, finder: PendingHooks):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        finder = self._finder
        depth = finder.depth
        depth.value = getattr(depth, "value", 0) + 1
        finder.chains.add(threading.get_ident())
        executed = False
        try:
            self._loader.exec_module(module)
            executed = True
        finally:
            depth.value -= 1
            module.__loader__ = self._loader  # the module's loader is the original one from now on
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
            if executed and module.__name__ in finder.modules and not getattr(depth, "triggered", ""):
                depth.triggered = module.__name__  # this thread's import chain brought a watched module in
            if depth.value == 0:
                finder.chains.discard(threading.get_ident())
                # The outermost import of the chain, also when it raised after the watched module had executed (the
                # watched module stays imported, and SGLang may go on to use it).
                triggered, depth.triggered = getattr(depth, "triggered", ""), ""
                if triggered and triggered in sys.modules:
                    finder.fire(triggered)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, get_resource_reader, ...
        return getattr(self._loader, name)


class PendingHooks(importlib.abc.MetaPathFinder):
    """The finder of :func:`when_imported` (``modules``: the watched names; ``done``: whether it has fired)."""

    def __init__(self, modules: Iterable[str], callback: Callable[[str], None], prefix: str = "sglang."):
        self.modules = frozenset(modules)
        #: The modules whose loaders are wrapped while waiting (the import chains that can hold a watched module).
        self.prefix = prefix
        self.callback = callback
        self.done = False
        #: Per thread: how many wrapped module executions are in progress (``value``), and the watched module its
        #: import chain brought in (``triggered``): the callback runs in that thread once its chain has completed.
        self.depth = threading.local()
        #: The threads inside a wrapped module's execution (set.add and discard are atomic).
        self.chains: set[int] = set()
        self._lock = threading.Lock()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if self.done or not fullname.startswith(self.prefix):
            return None
        if not self.chains:
            # A watched module imported through a finder ahead of this one (its loader never wrapped), and imported
            # completely: fire on the next sglang import, while no thread is inside a wrapped module's execution.
            loaded = next((name for name in sorted(self.modules) if _initialised(name)), None)
            if loaded is not None:
                self.fire(loaded)
                return None
        for finder in list(sys.meta_path):  # a copy: another finder may add or remove itself meanwhile
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None

    def fire(self, name: str) -> None:
        """Run the callback once (the first watched module to finish importing), having left ``sys.meta_path``. The
        lock only decides which thread runs it: the callback itself runs outside it (it imports modules, and another
        thread's import must not wait on it forever, nor this thread's own imports on itself)."""
        with self._lock:
            if self.done:
                return
            self.remove()
        try:
            self.callback(name)
        except Exception:  # noqa: BLE001 - never into the import that triggered it; the import itself succeeded
            logger.exception("sglang-moe-plugins: hooking on the import of %s failed; SGLang runs its own code", name)

    def remove(self) -> None:
        """Stop watching (the callback will not run if it has not)."""
        self.done = True
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _initialised(name: str) -> bool:
    """Whether module ``name`` is imported and has finished executing (a module is in ``sys.modules`` while it runs)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def when_imported(
    modules: Iterable[str], callback: Callable[[str], None], prefix: str = "sglang."
) -> PendingHooks | None:
    """Call ``callback(name)`` once, when the first of ``modules`` has been imported: at once (returning None) when one
    already is, else once the outermost ``prefix`` import that brought it in has completed (returning the finder)."""
    modules = tuple(modules)
    loaded = next((name for name in modules if name in sys.modules), None)
    if loaded is not None:
        callback(loaded)
        return None
    finder = PendingHooks(modules, callback, prefix)
    sys.meta_path.insert(0, finder)
    return finder
