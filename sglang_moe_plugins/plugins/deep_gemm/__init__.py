"""The DeepGEMM MegaMoE plugins ``mega_w4a8``, ``mega_w4a4`` and ``mega_sm90_fp8`` (one backend: sgl-deep-gemm).

Modules (this package imports none of them):

- :mod:`.plugin`: the variants table and the plugin classes (selection; no ``deep_gemm`` import);
- :mod:`.api`: which sgl-deep-gemm MegaMoE API is installed, read from its sources;
- :mod:`.launch`: a variant's launch closure, built once per shape and config;
- :mod:`.sglang_host`: what the plugins read from SGLang (its MegaMoE helpers, its JIT pre-dispatch);
- :mod:`.pre_dispatch_triton` / :mod:`.pre_dispatch_kernel`: this project's pre-dispatch (Triton).
"""

__all__: list[str] = []
