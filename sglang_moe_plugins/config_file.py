"""Reading the configuration file safely: a regular file of bounded size, UTF-8 (BOM accepted), TOML.

A path that is not a regular file (FIFO, device, socket) is refused before it is opened: opening a FIFO
blocks until a writer comes, and a device such as ``/dev/zero`` never ends.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

__all__ = ["CONFIG_ENV", "MAX_CONFIG_BYTES", "config_path", "read_file", "parse_file"]

CONFIG_ENV = "SGLANG_MOE_PLUGINS_CONFIG"
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


def config_path(env: Mapping[str, str]) -> str:
    path = env.get(CONFIG_ENV, "").strip()
    return os.path.expanduser(path) if path else ""
