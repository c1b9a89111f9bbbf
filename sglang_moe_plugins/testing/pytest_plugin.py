"""pytest plugin (entry point group ``pytest11``): the conformance suite inside a test run. Opt-in.

Installed with sglang-moe-plugins, it does nothing unless asked:

- ``pytest --moe-plugin NAME`` (repeatable; NAME, ``path/to/module.py[:Class]`` or ``module:Class``)
  adds one test item per target, ``moe-plugin-conformance[NAME]``, that fails with the report's
  summary. ``--moe-plugin-seed``, ``--moe-plugin-cases`` and ``--moe-plugin-device`` tune it.
- ``@pytest.mark.moe_plugin("NAME", seed=0, random_cases=8, ...)`` on a test that takes the
  ``moe_plugin_report`` fixture runs the suite and hands the test the
  :class:`~sglang_moe_plugins.testing.ConformanceReport`. Keyword arguments are ``SuiteOptions`` fields:
  seed, random_cases, catalog, models, eps, rows, edge_cases, device, max_elements, supports_budget_us,
  supports_limit_us, max_catalog_runs, repeats; another name fails the test naming the valid ones.
- The ``moe_conformance`` fixture is a function ``(target, **options) -> ConformanceReport``.

Reports are cached per (target, options) for the session. Loading the plugin imports only pytest and
the lazy package roots (``sglang_moe_plugins``, ``sglang_moe_plugins.testing``): no torch, no SGLang.
The suite's modules, and torch with them, are imported only when a test asks for the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_collection_modifyitems",
    "pytest_report_header",
    "moe_conformance",
    "moe_plugin_report",
    "ConformanceItem",
]

_MARKER = "moe_plugin"
_CACHE: dict[tuple[Any, ...], Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("moe-plugins", "sglang-moe-plugins conformance suite")
    group.addoption(
        "--moe-plugin",
        action="append",
        default=[],
        metavar="TARGET",
        help="run the conformance suite on this plugin (registered name, path/to/module.py[:Class] or module:Class); repeatable",
    )
    group.addoption(
        "--moe-plugin-seed",
        type=int,
        default=None,
        metavar="SEED",
        help="seed of the suite's random cases (default: drawn and printed)",
    )
    group.addoption(
        "--moe-plugin-cases", type=int, default=None, metavar="N", help="number of random cases (default 24)"
    )
    group.addoption("--moe-plugin-device", default=None, metavar="DEVICE", help="auto (default), cpu, cuda or cuda:N")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(target, **options): run the sglang-moe-plugins conformance suite on target; the test gets the "
        "report from the moe_plugin_report fixture (options are SuiteOptions fields: seed, random_cases, catalog, models, eps, "
        "rows, edge_cases, device, max_elements, supports_budget_us, supports_limit_us, max_catalog_runs, repeats)",
    )


def _cli_options(config: pytest.Config) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if config.getoption("--moe-plugin-seed") is not None:
        options["seed"] = config.getoption("--moe-plugin-seed")
    if config.getoption("--moe-plugin-cases") is not None:
        options["random_cases"] = config.getoption("--moe-plugin-cases")
    if config.getoption("--moe-plugin-device") is not None:
        options["device"] = config.getoption("--moe-plugin-device")
    return options


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value if isinstance(value, (str, int, float, bool, type(None))) else id(value)


def _run(target: Any, options: dict[str, Any]) -> Any:
    import dataclasses

    from .case import SuiteOptions
    from .suite import run_conformance

    valid = [f.name for f in dataclasses.fields(SuiteOptions)]
    unknown = [k for k in options if k not in valid]
    if unknown:
        pytest.fail(
            f"moe_plugin options: unknown keyword(s) {', '.join(map(repr, unknown))}; valid (SuiteOptions fields): "
            f"{', '.join(valid)}",
            pytrace=False,
        )

    key = (_freeze(target) if isinstance(target, str) else id(target), _freeze(options))
    if key not in _CACHE:
        _CACHE[key] = run_conformance(target, **options)
    return _CACHE[key]


def pytest_report_header(config: pytest.Config) -> str | None:
    targets = config.getoption("--moe-plugin")
    if not targets:
        return None
    seed = config.getoption("--moe-plugin-seed")
    return f"sglang-moe-plugins conformance: {', '.join(targets)} (seed {seed if seed is not None else 'drawn per run, in each report'})"


class ConformanceItem(pytest.Item):
    """One test item running the suite on a ``--moe-plugin`` target."""

    def __init__(self, *, target: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.target = target
        self.report: Any = None

    def runtest(self) -> None:
        self.report = _run(self.target, _cli_options(self.config))
        self.report.raise_for_failures()  # the failure shows the summary (repr_failure)
        self.add_report_section("call", "conformance", self.report.summary())  # shown with -rP

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        from .report import ConformanceFailure

        if isinstance(excinfo.value, ConformanceFailure):
            return excinfo.value.report.summary()
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"moe-plugin-conformance[{self.target}]"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    added = [
        ConformanceItem.from_parent(session, name=f"moe-plugin-conformance[{target}]", target=target)
        for target in config.getoption("--moe-plugin")
    ]
    if added:
        items.extend(added)
        # Report them as collected, so that pytest's "collected N items" line counts them.
        report = pytest.CollectReport(session.nodeid or "moe-plugin-conformance", "passed", None, list(added))
        config.hook.pytest_collectreport(report=report)


@pytest.fixture
def moe_conformance(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``moe_conformance(target, **options) -> ConformanceReport`` (cached per session; the command
    line's --moe-plugin-seed/--moe-plugin-cases/--moe-plugin-device apply unless options override them)."""

    def run(target: Any, **options: Any) -> Any:
        return _run(target, {**_cli_options(request.config), **options})

    return run


@pytest.fixture
def moe_plugin_report(request: pytest.FixtureRequest) -> Any:
    """The conformance report of the target named by the test's ``@pytest.mark.moe_plugin(...)``."""
    marker = request.node.get_closest_marker(_MARKER)
    if marker is None or not marker.args:
        pytest.fail(
            f"moe_plugin_report needs @pytest.mark.{_MARKER}('plugin name or path/to/module.py:Class', **options)",
            pytrace=False,
        )
    return _run(marker.args[0], {**_cli_options(request.config), **marker.kwargs})
