"""Issue #30, findings 13-17: ``sglang-moe-plugins explain --model PATH`` hardened against hostile config.json
files, run as a user runs it (``python -m sglang_moe_plugins.cli explain ...`` in a subprocess, the installed
SGLang next to it): every bad input is one error line on stderr (no traceback), exit 2, within a timeout that
guards against hangs; and what is accepted is explained with its exact values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

EXE = [sys.executable, "-m", "sglang_moe_plugins.cli"]

#: The keys explain reads, as a MoE model's config.json has them (Qwen3-30B-A3B-FP8's sizes and quantization).
BASE = {
    "hidden_size": 2048,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}

#: A Mersenne prime: no EP size but 1 and itself divides it, and listing its divisors never ends.
HUGE_PRIME = 2**61 - 1


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    return subprocess.run([*EXE, *args], capture_output=True, text=True, env=env, timeout=timeout)


def write(tmp_path, text: str, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def config(tmp_path, **keys: object) -> str:
    return write(tmp_path, json.dumps({**BASE, **keys}))


def one_error_line(result: subprocess.CompletedProcess, *needles: str) -> str:
    """The single stderr line of a usage error (exit 2), which names what it must."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith("sglang-moe-plugins explain: error: "), lines[0]
    assert len(lines[0]) < 600, lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# Finding 13: an EP or TP that does not divide a huge count answered at once, with a bounded message.


@pytest.mark.parametrize(
    ("keys", "flags", "needles"),
    [
        ({"num_experts": HUGE_PRIME}, ("--ep", "7"), ("--ep", "EP7 does not divide", str(HUGE_PRIME))),
        ({"moe_intermediate_size": 128 * HUGE_PRIME}, ("--tp", "7"), ("--tp", "TP7")),
    ],
    ids=["ep-huge-experts", "tp-huge-intermediate"],
)
def test_huge_count_not_divided_is_one_bounded_line(tmp_path, keys, flags, needles):
    one_error_line(cli("explain", "--model", config(tmp_path, **keys), *flags, timeout=60), *needles)


def test_huge_explicit_experts_not_divided_is_one_bounded_line():
    result = cli("explain", "--experts", str(HUGE_PRIME), "--hidden", "512", "--topk", "2", "--ep", "7", timeout=60)
    one_error_line(result, "--ep", "EP7 does not divide")


def test_small_counts_still_list_the_divisors(tmp_path):
    one_error_line(cli("explain", "--model", config(tmp_path), "--ep", "3"), "allowed: 1, 2, 4, 8, 16, 32, 64, 128")


# Finding 14: a FIFO, /dev/zero, /dev/urandom refused before opening; the read bounded.


def test_fifo_is_refused_without_opening(tmp_path):
    fifo = str(tmp_path / "config.json")
    os.mkfifo(fifo)
    try:
        one_error_line(cli("explain", "--model", fifo, timeout=60), "--model", "FIFO", "regular file")
    finally:
        # Had the command opened the FIFO, it would be blocked there: a writer frees it (the test has failed).
        threading.Thread(target=lambda: open(fifo, "w").close(), daemon=True).start()


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_is_refused_without_reading(device):
    one_error_line(cli("explain", "--model", device, timeout=60), "--model", "device", "regular file")


def test_oversized_file_is_refused_by_its_size(tmp_path):
    path = write(tmp_path, json.dumps({**BASE, "pad": "x" * (17 << 20)}))
    one_error_line(cli("explain", "--model", path, timeout=60), "--model", "MB")


# Finding 15: nested JSON and a 401-digit swiglu_limit are one error line.


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"],
    ids=["nested-list", "nested-in-object"],
)
def test_deeply_nested_json_is_one_error_line(tmp_path, text):
    one_error_line(cli("explain", "--model", write(tmp_path, text), timeout=60), "--model", "nest")


def test_swiglu_limit_of_401_digits_is_one_error_line(tmp_path):
    text = json.dumps(BASE)[:-1] + ', "swiglu_limit": 1' + "0" * 400 + "}"
    one_error_line(cli("explain", "--model", write(tmp_path, text)), "--model", "swiglu_limit")


# Finding 16: limits explained exactly, non-finite ones refused, topk within the experts.


@pytest.mark.parametrize(("limit", "shown"), [(1e-07, "1e-07"), (1e20, "1e+20"), (7.25, "7.25")])
def test_swiglu_limit_is_explained_exactly(tmp_path, limit, shown):
    path = config(tmp_path, swiglu_limit=limit)
    args = ("explain", "--model", path, "--platform", "sm90", "--op", "silu_mul_quant", "--rows", "128")
    result = cli(*args, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    calls = json.loads(result.stdout)["calls"]
    assert calls and all(c["config"]["swiglu_limit"] == limit for c in calls), calls
    assert all(f"limit={shown}" in c["call"] for c in calls), [c["call"] for c in calls]
    text = cli(*args)
    assert text.returncode == 0 and f"limit={shown} " in text.stdout and "limit=1 " not in text.stdout, text.stdout


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_non_finite_swiglu_limit_is_refused_naming_the_key(tmp_path, value):
    path = write(tmp_path, json.dumps(BASE)[:-1] + f', "swiglu_limit": {value}}}')
    one_error_line(cli("explain", "--model", path, "--platform", "sm90"), "--model", "swiglu_limit", "finite")


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0"])
def test_non_finite_limit_flag_is_refused(value):
    result = cli("explain", "--experts", "8", "--hidden", "512", "--topk", "2", f"--limit={value}")
    one_error_line(result, "--limit", "finite")


def test_topk_above_the_experts_is_refused(tmp_path):
    one_error_line(
        cli("explain", "--model", config(tmp_path, num_experts_per_tok=129)), "num_experts_per_tok", "129", "128"
    )
    one_error_line(cli("explain", "--experts", "8", "--hidden", "512", "--topk", "9"), "--topk", "9", "8")


# Finding 17: control characters from the file escaped; one size error wrapped once.


def test_control_characters_from_the_file_are_escaped(tmp_path):
    path = config(
        tmp_path,
        _name_or_path="\x1b[31mRED\x1b[0m\u202e",
        quantization_config={"quant_method": "fp8\x1b[2J", "weight_block_size": [128, 128]},
    )
    for extra in ((), ("--json",)):
        result = cli("explain", "--model", path, "--platform", "sm90", *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        out = result.stdout + result.stderr
        assert "\x1b" not in out and "\u202e" not in out, repr(out[:400])
    assert "\\x1b[31mRED\\x1b[0m" in cli("explain", "--model", path, "--platform", "sm90").stdout


def test_control_characters_in_a_bad_value_are_escaped(tmp_path):
    result = cli("explain", "--model", config(tmp_path, num_experts="\x1b[31m8"))
    line = one_error_line(result, "num_experts")
    assert "\x1b" not in result.stderr and "\\x1b" in line


def test_size_error_is_wrapped_once(tmp_path):
    path = write(tmp_path, json.dumps({**BASE, "pad": "x" * (17 << 20)}))
    line = one_error_line(cli("explain", "--model", path))
    assert line.count("allowed:") == 1 and "invalid argument" not in line and "JSON file" not in line, line
