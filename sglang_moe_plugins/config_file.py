"""Reading the configuration file safely: a regular file of bounded size, UTF-8 (BOM accepted), TOML; and the
two settings that SGLang's start-up reads even when the rest of the configuration is invalid: what an invalid
configuration does (:func:`config_error_policy`) and the rollback switches ``stock`` and ``parity``
(:func:`stock_rollback`).

A path that is not a regular file (FIFO, device, socket) is refused before it is opened: opening a FIFO
blocks until a writer comes, and a device such as ``/dev/zero`` never ends.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .config_values import (
    _FALSE,
    CONFIG_ENV,
    ON_CONFIG_ERROR_CHOICES,
    ON_CONFIG_ERROR_ENV,
    PARITY_ENV,
    PARITY_STOCK_OPS,
    STOCK_ALL,
    STOCK_ENV,
    _names,
    _one_or_list,
    _string_list,
    did_you_mean,
)
from .errors import ConfigError

__all__ = [
    "CONFIG_ENV",
    "MAX_CONFIG_BYTES",
    "StockRollback",
    "config_path",
    "config_error_policy",
    "read_file",
    "parse_file",
    "stock_rollback",
    "unknown_stock_op",
]

#: Largest configuration file read (bytes); a larger one is a ConfigError.
MAX_CONFIG_BYTES = 1 << 20


def read_file(path: str, origin: str) -> bytes:
    """The bytes of the configuration file, refusing anything but a regular file of at most
    :data:`MAX_CONFIG_BYTES` before opening it (opening a FIFO blocks until a writer comes)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{origin}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read the file: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{origin} is a directory; it must name a TOML file") from None
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(info.st_mode)
            else "a socket"
            if stat.S_ISSOCK(info.st_mode)
            else "a device"
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
            else "not a regular file"
        )
        raise ConfigError(f"{origin} is {kind}; it must name a regular TOML file (not opened)")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{origin} is {info.st_size} bytes; a configuration file may have at most {MAX_CONFIG_BYTES}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read the file: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:  # grew since stat()
        raise ConfigError(f"{origin} has more than {MAX_CONFIG_BYTES} bytes, the most a configuration file may have")
    return data


def parse_file(path: str, origin: str) -> dict[str, Any]:
    data = read_file(path, origin)
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark, as some editors write
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{origin}: not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} at offset "
            f"{exc.start}); TOML files are UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: TOML syntax error: {exc}") from None
    except RecursionError:  # tomllib recurses per nesting level: a hostile file must not escape as RecursionError
        raise ConfigError(f"{origin}: TOML nested too deeply to read") from None


def config_path(env: Mapping[str, str]) -> str:
    path = env.get(CONFIG_ENV, "").strip()
    return os.path.expanduser(path) if path else ""


def config_error_policy(env: Mapping[str, str] | None = None) -> str:
    """What an invalid configuration does: ``"closed"`` (the default) or ``"stock"``.

    ``SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR``, else the file's ``on_config_error`` where the file can be read
    and that key is valid; anything unreadable or invalid means ``"closed"``: a mistake fails closed.
    """
    env = os.environ if env is None else env
    raw = env.get(ON_CONFIG_ERROR_ENV, "").strip().lower()
    if raw:
        return raw if raw in ON_CONFIG_ERROR_CHOICES else "closed"
    path = config_path(env)
    if not path:
        return "closed"
    try:
        value = parse_file(path, CONFIG_ENV).get("on_config_error", "closed")
    except ConfigError:
        return "closed"
    return value if value in ON_CONFIG_ERROR_CHOICES else "closed"


def unknown_stock_op(op: str, origin: str, op_names: Iterable[str]) -> str:
    """The error for an unknown op in ``stock``, with the valid ones and the closest."""
    op_names = sorted(op_names)
    return f"unknown op {op!r} ({origin}); valid ops: {', '.join(op_names)}, or {STOCK_ALL!r}" + did_you_mean(
        op, [*op_names, STOCK_ALL]
    )


@dataclass(frozen=True)
class StockRollback:
    """The ops ``register()`` leaves unhooked, read from every source that can be read (:func:`stock_rollback`)."""

    ops: frozenset[str]
    #: One line per unknown op name (then ``ops`` is every op: an unknown name never fails closed).
    errors: tuple[str, ...] = ()
    #: ``parity`` asked for (its ops are in ``ops``; SGLang's guard keeps its masked-layout decision).
    parity: bool = False


def stock_rollback(ops: Iterable[str], env: Mapping[str, str] | None = None) -> StockRollback:
    """The rollback switch as SGLang's start-up honours it, whatever else the configuration says (``parity`` too:
    its ops are stock).

    ``SGLANG_MOE_PLUGINS_STOCK`` always; the file's ``stock`` key whenever the file parses as TOML and the key is
    a list of op names, also when other keys of the file are wrong. ``all`` is every op of ``ops``; so is an
    unknown name, with one error line naming it (a rollback never makes things worse than SGLang's own code)."""
    env = os.environ if env is None else env
    valid = sorted(ops)
    origins: dict[str, str] = {}
    parity: list[str] = []  # where parity was asked for
    path = config_path(env)
    if path:
        try:
            data = parse_file(path, CONFIG_ENV)
        except ConfigError:  # unreadable or not TOML: its ConfigError names it
            data = {}
        try:
            names = _string_list(_one_or_list(data.get("stock", [])), "stock", "", "op names")  # "all" as a string too
        except ConfigError:  # the key malformed
            names = frozenset()
        origins.update((name, f"'stock' in {path}") for name in sorted(names))
        parity += [f"parity = true in {path}"] if data.get("parity") is True else []
    origins.update((name, STOCK_ENV) for name in _names(env.get(STOCK_ENV, "")))
    raw_parity = env.get(PARITY_ENV, "").strip().lower()
    parity += [] if raw_parity in _FALSE else [f"{PARITY_ENV}={raw_parity}"]  # an invalid value counts too
    for op in PARITY_STOCK_OPS if parity else ():
        origins.setdefault(op, parity[0])
    unknown = [name for name in origins if name != STOCK_ALL and name not in valid]
    if unknown or STOCK_ALL in origins:
        errors = tuple(unknown_stock_op(n, f"left to SGLang by {origins[n]}", valid) for n in unknown)
        return StockRollback(frozenset(valid), errors, bool(parity))
    return StockRollback(frozenset(origins), (), bool(parity))
