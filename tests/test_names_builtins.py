"""The conformance kit's ``name`` check reads the built-ins from this package's own distribution, proved by
location: a dist-info that only says ``Name: sglang-moe-plugins`` cannot redefine what a built-in is."""

from __future__ import annotations

import sys

from sglang_moe_plugins.testing.names import builtin_plugins, check_name


class _Impostor:
    name = "reference"
    op = "silu_mul_quant"


def test_an_impostor_dist_info_named_like_the_package_does_not_define_the_builtins(tmp_path, monkeypatch):
    meta = tmp_path / "sglang_moe_plugins-9.9.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-moe-plugins\nVersion: 9.9\n")
    (meta / "entry_points.txt").write_text(
        f"[sglang_moe_plugins.kernels]\nreference = {__name__}:_Impostor\nimpostor_only = {__name__}:_Impostor\n"
    )
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    builtins = builtin_plugins()
    assert "impostor_only" not in builtins
    assert builtins["reference"].startswith("sglang_moe_plugins."), builtins["reference"]
    problem = check_name(_Impostor(), "reference")
    assert problem is not None and "built-in plugin" in problem, problem
