"""A model's MoE layer read from its HuggingFace ``config.json`` (``explain --model PATH``, for models the catalog
lacks): the file is read as a hostile input (only a regular file, bounded, nesting and numbers checked), and every
string of it that is printed has its control characters escaped. :func:`sglang_moe_plugins.catalog.model_from_hf_config`
is the public name."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from .catalog import ModelSpec
from .errors import InvalidArgumentError
from .ops.base import BF16_MIN_NORMAL, finite_float

__all__ = ["DenseModelError", "BF16_NOT_SERVED", "read_hf_config"]

#: Why SGLang's DeepGEMM MoE runner makes no silu_mul_quant call for a bf16 checkpoint (0.5.16-0.5.23:
#: ``DeepGemmRunnerCore.run`` takes ``_run_masked_bf16_gemm`` / ``_run_bf16_contiguous_gemm`` for bf16 weights).
BF16_NOT_SERVED = (
    "bf16 weights (no quantization_config): SGLang's DeepGEMM MoE runner makes these calls on its FP8 path only; "
    "bf16 experts run on its bf16 path (--moe-runner-backend deep_gemm) or on the triton runner (the default), "
    "so no plugin is involved. Launched with --quantization fp8 (online FP8), the FP8 path runs them: "
    "explain --quantization fp8 explains that"
)


class DenseModelError(InvalidArgumentError):
    """The config.json has no routed experts (no ``num_experts``-like key, or 0): a dense model, which runs no MoE
    layer. ``name`` is the model's printable name."""

    def __init__(self, name: str, source: str):
        super().__init__(
            "model config",
            "/".join(_HF_EXPERTS),
            None,
            f"one of these keys in {source} (a MoE model's config.json; this one is a dense model)",
        )
        self.name = name


#: HuggingFace config keys, in the order tried: routed experts, per-expert intermediate size, experts per token.
_HF_EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_HF_INTER = ("moe_intermediate_size", "intermediate_size")
_HF_TOPK = ("num_experts_per_tok", "moe_topk", "top_k")
_CONFIG_MAX_BYTES = 4 << 20


def _printable(text: str) -> str:
    """``text`` with its control and format characters escaped (``\\x1b``, ``\\u202e``): what a file says is
    printed, never a terminal escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _shown(value: object) -> object:
    """A value of a config.json as an error shows it: numbers and null as they are, a string escaped and cut,
    an array or object by its kind (its repr may be long or nested past the recursion limit)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _printable(value if len(value) <= 80 else value[:77] + "...")
    return f"<a JSON {'array' if isinstance(value, list) else 'object'}>"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hf_int(cfg: dict[str, Any], keys: tuple[str, ...], source: str) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, list) and value and all(_is_int(v) and v == value[0] for v in value):
            value = value[0]  # some configs give one value per layer
        if not _is_int(value) or value < 1:
            raise InvalidArgumentError("model config", key, _shown(value), f"an int >= 1 (in {source})")
        return value
    raise InvalidArgumentError(
        "model config", "/".join(keys), None, f"one of these keys in {source} (a MoE model's config.json)"
    )


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _read_config(source: str) -> bytes:
    """The bytes of a config.json: anything but a regular file of at most :data:`_CONFIG_MAX_BYTES` is refused
    before it is read (opening a FIFO blocks until a writer comes; ``/dev/zero`` never ends). Opened without
    blocking and checked again on the open file, so a path swapped after the first check is refused too.
    A directory is read as SGLang reads ``--model-path``: its ``config.json``."""
    if os.path.isdir(source):
        source = os.path.join(source, "config.json")

    def refuse(allowed: str) -> InvalidArgumentError:
        return InvalidArgumentError("model config", "path", source, allowed)

    def check(info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise refuse(f"a regular file (it is {_file_kind(info.st_mode)}; not opened)")
        if info.st_size > _CONFIG_MAX_BYTES:
            raise refuse(f"a config.json of at most {_CONFIG_MAX_BYTES >> 20} MB (it has {info.st_size} bytes)")

    try:
        check(os.stat(source))
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise refuse(f"a readable file ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "rb") as handle:
            check(os.fstat(handle.fileno()))
            data = handle.read(_CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise refuse(f"a readable file ({exc.strerror or exc})") from None
    if len(data) > _CONFIG_MAX_BYTES:  # grew since it was checked
        raise refuse(f"a config.json of at most {_CONFIG_MAX_BYTES >> 20} MB")
    return data


def read_hf_config(path: str | os.PathLike[str]) -> ModelSpec:
    """A model's MoE layer read from its HuggingFace ``config.json`` (for models the catalog lacks).

    Reads the routed experts (``num_experts``, ``n_routed_experts`` or ``num_local_experts``), the per-expert
    intermediate size (``moe_intermediate_size``, else ``intermediate_size``), ``num_experts_per_tok``,
    ``hidden_size``, ``swiglu_limit`` and the quantization group size (``quantization_config.weight_block_size``),
    from the top level or from ``text_config`` (multimodal configs). gpt-oss (``model_type`` ``gpt_oss``) is
    marked as its clamped activation, which SGLang runs through its own ``gemm1_alpha`` path. ``path`` may be a
    model directory (SGLang's ``--model-path``): its ``config.json`` is read. A config without routed experts
    raises :class:`DenseModelError`; bf16 weights, or a quantization method other than FP8, set ``not_served``.
    """
    path_text = os.fspath(path)
    data = _read_config(path_text)
    source = _printable(path_text)
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError("model config", "path", source, f"a JSON file ({exc})") from None
    except RecursionError:
        raise InvalidArgumentError(
            "model config", "path", source, "a JSON file nested less deeply (a config.json nests a few levels)"
        ) from None
    if not isinstance(raw, dict):
        raise InvalidArgumentError("model config", "path", source, "a JSON object (a HuggingFace config.json)")
    cfg = {**raw, **raw["text_config"]} if isinstance(raw.get("text_config"), dict) else raw
    if all(cfg.get(key) in (None, 0) for key in _HF_EXPERTS):
        raise DenseModelError(_model_name(raw, path_text), source)
    experts = _hf_int(cfg, _HF_EXPERTS, source)
    inter = _hf_int(cfg, _HF_INTER, source)
    topk = _hf_int(cfg, _HF_TOPK, source)
    if topk > experts:
        topk_key = next(k for k in _HF_TOPK if cfg.get(k) is not None)
        raise InvalidArgumentError(
            "model config", topk_key, topk, f"an int from 1 to the {experts} routed experts (in {source})"
        )
    hidden = _hf_int(cfg, ("hidden_size",), source)
    raw_limit = cfg.get("swiglu_limit")
    limit = None if raw_limit is None else finite_float(raw_limit)
    if raw_limit is not None and (limit is None or not limit >= BF16_MIN_NORMAL):
        raise InvalidArgumentError(
            "model config",
            "swiglu_limit",
            _shown(raw_limit),
            f"a finite number >= 2**-126 (bf16's smallest normal) that fits a float, or null (in {source})",
        )
    quant = cfg.get("quantization_config")
    if not isinstance(quant, dict):
        quant = {}
    block = quant.get("weight_block_size")
    group = None
    if block is not None:
        if not (
            isinstance(block, list)
            and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
        ):
            raise InvalidArgumentError(
                "model config",
                "quantization_config.weight_block_size",
                _shown(block) if not isinstance(block, list) or len(block) > 8 else [_shown(b) for b in block],
                f"two ints > 0, e.g. [128, 128] (in {source})",
            )
        group = block[1]
    if cfg.get("model_type") == "gpt_oss":
        act = "gpt-oss clamped swiglu"
    else:
        act = f"swiglu_limit={limit!r}" if limit is not None else "silu"
    method = quant.get("quant_method")
    method = str(_shown(method)) if method is not None else "quantized" if block else "bf16"
    quant_text = f"{method} block {block[0]}x{block[1]}" if block else method
    if not quant:
        not_served = BF16_NOT_SERVED
    elif method != "fp8" and not (block and quant.get("quant_method") is None):
        not_served = (
            f"quantization_config.quant_method {method!r}: not modelled (explain models SGLang's FP8 MoE method, "
            "quant_method 'fp8', whose DeepGEMM runner makes these calls, and bf16 weights)"
        )
    else:
        not_served = ""
    return ModelSpec(
        f"config/{_model_name(raw, path_text)}",
        hidden,
        inter,
        experts,
        topk,
        0,
        act,
        quant_text,
        f"read from {source}",
        group,
        not_served,
    )


def _model_name(raw: dict[str, Any], path_text: str) -> str:
    """The model's printable name: ``_name_or_path``'s last part, else the directory's name, else the file's."""
    given = raw.get("_name_or_path")
    name = os.path.basename(given.rstrip("/")) if isinstance(given, str) else ""
    if not name:
        folder = path_text if os.path.isdir(path_text) else os.path.dirname(os.path.abspath(path_text))
        name = os.path.basename(os.path.abspath(folder)) or os.path.basename(path_text)
    return _printable(name[:200])
