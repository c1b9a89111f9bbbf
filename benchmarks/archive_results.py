#!/usr/bin/env python3
"""Move every file of ``benchmarks/results/`` except the current ones into
``benchmarks/results/archive/<date>-<commit>/`` (the commit that added it, from ``git log``), and write a
``MANIFEST.md`` and ``manifest.json`` per folder: commit, device, driver, torch/triton/SGLang/DeepGEMM
versions as the files record them (``null`` where they do not). Run from the repository root:

    python benchmarks/archive_results.py [--keep FILE ...] [--dry-run]

Files already in ``archive/`` are left alone. The current results stay at the top of ``results/``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
CURRENT = (
    "contig_e2e_NVIDIA-H200.json",
    "contig_e2e_NVIDIA-H200.md",
    "contig_activation_NVIDIA-H200.json",
    "contig_activation_NVIDIA-H200.md",
    "contig_host_overhead_cpu.json",
    "silu_mul_quant_2026-12-02_NVIDIA-H200.json",
    "silu_mul_quant_2026-12-02_NVIDIA-H200.md",
    "silu_mul_quant_2026-12-02_NVIDIA-H200.png",
    "smq_kernel_variants_2026-12-02_NVIDIA-H200.json",
    "smq_ncu_2026-12-02_NVIDIA-H200.csv",
    "smq_ncu_decode_2026-12-02_NVIDIA-H200.csv",
    "smq_experiment_2026-12-02_NVIDIA-H200.json",
    "mega_pre_dispatch_h200.json",
    "mega_pre_dispatch_h200.md",
    "host_overhead_NVIDIA-H200.json",
    "host_overhead_NVIDIA-H200.md",
    "host_overhead_cpu_compare.json",
    "host_overhead_cpu_compare.md",
    "host_overhead_kernels_NVIDIA-H200.json",
    "mega_call_overhead_cpu_compare.md",
    "mega_call_overhead_host_NVIDIA-H200.json",
    "mega_call_overhead_triton_NVIDIA-H200.json",
    "mega_moe_sm90_NVIDIA-H200.json",
    "mega_moe_sm90_NVIDIA-H200.md",
    "load_plugins_cost_cpu.json",
    "load_plugins_cost_cpu.md",
)
FIELDS = ("device", "driver", "torch", "triton", "sglang", "sgl_deep_gemm")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=RESULTS).stdout.strip()


def added_by(path: pathlib.Path) -> tuple[str, str, str]:
    """(short commit, date, subject) of the commit that added ``path``."""
    line = git("log", "--diff-filter=A", "--format=%h|%ad|%s", "--date=short", "--", path.name).splitlines()[-1]
    commit, date, subject = line.split("|", 2)
    return commit, date, subject


def facts(path: pathlib.Path) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except ValueError:
            data = {}
        if isinstance(data, dict):
            run = data.get("run") if isinstance(data.get("run"), dict) else {}
            for key in FIELDS:
                value = run.get(key, data.get(key))
                if value is not None:
                    out[key] = str(value)
            host = data.get("host_kernels")
            if isinstance(host, str) and "sglang" in host and "sglang" not in out:
                match = re.search(r"sglang (\S+)", host)
                out["sglang"] = f"{match.group(1)} (JIT sources)" if match else None
    elif path.suffix in (".txt", ".md"):
        text = path.read_text(errors="replace")[:20000]
        for key, pattern in (
            ("driver", r"Driver Version:\s*([\d.]+)"),
            ("torch", r"torch[ =]([\d.]+\+?\w*)"),
            ("triton", r"triton[ =]([\d.]+)"),
            ("device", r"(NVIDIA H\d+(?: \([^)\n]*\))?)"),
        ):
            match = re.search(pattern, text)
            if match:
                out[key] = match.group(1).strip()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--keep", nargs="*", default=list(CURRENT), help="files that stay at the top (the current results)"
    )
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    groups: dict[str, list[tuple[pathlib.Path, str]]] = {}
    for path in sorted(RESULTS.iterdir()):
        if not path.is_file() or path.name in args.keep or path.name == "README.md":
            continue
        commit, date, subject = added_by(path)
        groups.setdefault(f"{date}-{commit}", []).append((path, subject))
    for folder, files in sorted(groups.items()):
        print(f"{folder}: {len(files)} files")
        if args.dry_run:
            continue
        target = RESULTS / "archive" / folder
        target.mkdir(parents=True, exist_ok=True)
        for path, _ in files:
            subprocess.run(
                ["git", "mv", path.name, str(target.relative_to(RESULTS) / path.name)], check=True, cwd=RESULTS
            )
    if not args.dry_run:
        for target in sorted((RESULTS / "archive").glob("*-*")):
            if target.is_dir():
                write_manifest(target)


def write_manifest(target: pathlib.Path) -> None:
    """``MANIFEST.md`` and ``manifest.json`` of one archive folder (named ``<date>-<commit>``)."""
    date, commit = target.name.rsplit("-", 1)
    full = git("rev-parse", commit)
    subject = git("log", "-1", "--format=%s", full)
    files = sorted(p for p in target.iterdir() if p.is_file() and p.name not in ("MANIFEST.md", "manifest.json"))
    merged: dict[str, set[str]] = {k: set() for k in FIELDS}
    for path in files:
        for key, value in facts(path).items():
            if value:
                merged[key].add(value)
    manifest = {
        "commit": full,
        "commit_subject": subject,
        "date": date,
        "note": "the commit that added these files; the measured code is that commit's tree or its parent "
        "(these results did not record their commit; newer ones do, under 'run')",
        **{k: sorted(v) or None for k, v in merged.items()},
        "files": [p.name for p in files],
    }
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    lines = [
        f"# Results added by {full[:12]} ({date})",
        "",
        f"Commit: `{full}` - {subject}",
        "",
        manifest["note"] + ".",
        "",
    ]
    lines += [f"- {k}: {', '.join(v) if v else 'not recorded'}" for k, v in ((k, manifest[k]) for k in FIELDS)]
    lines += ["", "Files:", ""] + [f"- `{name}`" for name in manifest["files"]]
    (target / "MANIFEST.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
