"""The paths ``benchmarks/silu_mul_quant.py`` times: this project's Triton plugin, SGLang's DSV4 JIT kernel and
its masked fused ``per_token_group_quant``, each as SGLang calls it or through this project's plugin."""

from __future__ import annotations

from ..ops.silu_mul_quant import SiluMulQuantInputs, describe
from .smq_cases import Case

__all__ = ["Paths"]


class Paths:
    """Callables for each path: ``fn(gateup, masked_m, outputs, case)``; None when unavailable."""

    def __init__(self, host, host_nopdl=None) -> None:
        from ..plugins.triton_smq.plugin import TritonPlugin

        self.host = host
        self.host_nopdl = host_nopdl
        self.triton = TritonPlugin()
        self.jit_plugin = self._try_plugin("sglang_moe_plugins.plugins.sglang_kernels.jit_ep", "JitEpPlugin")
        self.fb_plugin = self._try_plugin("sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback", "Fp8FallbackPlugin")

    @staticmethod
    def _try_plugin(module: str, cls: str):
        try:
            mod = __import__(module, fromlist=[cls])
            return getattr(mod, cls)()
        except Exception:
            return None

    @staticmethod
    def shape_config(gateup, masked_m, case: Case, layout: str | None = None):
        return describe(
            gateup,
            masked_m,
            group_size=case.gs,
            topk=case.topk,
            swiglu_limit=case.limit,
            swizzle=case.swizzle,
            scale_layout=layout or case.layout,  # type: ignore[arg-type]  # a layout name
        )

    def run_triton(self, gateup, masked_m, outputs, case, layout=None, kcfg=None, pdl=True):
        shape, config = self.shape_config(gateup, masked_m, case, layout)
        if kcfg is None and pdl:
            self.triton.run(SiluMulQuantInputs(gateup, masked_m), outputs, shape, config)
        else:
            from ..plugins.triton_smq import launch as K
            from ..quant import round_to_bf16

            K.launch(
                gateup,
                masked_m,
                outputs.out,
                outputs.scale,
                group_size=case.gs,
                swiglu_limit=None if case.limit is None else round_to_bf16(case.limit),
                swizzle=case.swizzle,
                ue8m0=case.ue8m0,
                config=kcfg,
                pdl=pdl,
            )

    def jit_layout(self, case: Case) -> str:
        return "ue8m0_packed" if case.ue8m0 else "row_major"

    def jit_via(self, case: Case) -> str | None:
        # SGLang's kernel as SGLang calls it ("raw"); the jit_ep plugin adds a masked_m clamp kernel in
        # front (the op's defined result for masked_m outside [0, N]), timed separately as jit_ep_plugin
        if self.host is not None and case.jit_reason() is None:
            return "raw"
        if self.jit_plugin is not None:
            shape, config = self._meta(case, self.jit_layout(case))
            try:
                if self.jit_plugin.supports(shape, config):
                    return "plugin"
            except Exception:
                pass
        if self.host is None or case.jit_reason() is not None:
            return None
        return "raw"

    def _meta(self, case: Case, layout: str):
        from ..hardware import local_platform
        from ..ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape

        return (
            SiluMulQuantShape(case.E, case.N, case.D, case.gs, case.topk),
            SiluMulQuantConfig(local_platform(), case.limit, case.swizzle, layout, False),  # type: ignore[arg-type]  # a layout name
        )

    def run_jit(self, gateup, masked_m, outputs, case, via):
        if via == "plugin":
            shape, config = self.shape_config(gateup, masked_m, case, self.jit_layout(case))
            from ..plugins.sglang_kernels.host import use_host_kernels

            with use_host_kernels(self.host):
                self.jit_plugin.run(SiluMulQuantInputs(gateup, masked_m), outputs, shape, config)
            return
        scale = outputs.scale.transpose(1, 2) if case.ue8m0 else outputs.scale
        self.host.silu_and_mul_masked_post_quant(
            gateup,
            outputs.out,
            scale,
            case.gs,
            masked_m,
            scale_ue8m0=case.ue8m0,
            topk=case.topk,
            transposed=case.ue8m0,
            swiglu_limit=case.limit,
            swizzle=case.swizzle,
        )

    def run_jit_nopdl(self, gateup, masked_m, outputs, case):
        scale = outputs.scale.transpose(1, 2) if case.ue8m0 else outputs.scale
        self.host_nopdl.silu_and_mul_masked_post_quant(
            gateup,
            outputs.out,
            scale,
            case.gs,
            masked_m,
            scale_ue8m0=case.ue8m0,
            topk=case.topk,
            transposed=case.ue8m0,
            swiglu_limit=case.limit,
            swizzle=case.swizzle,
        )

    def fb_layout(self, case: Case) -> str:
        return case.layout

    def fb_via(self, case: Case) -> str | None:
        if self.host is not None and not case.swizzle and case.limit is None:
            return "raw"  # SGLang's default path as SGLang calls it (the plugin adds a masked_m clamp)
        if self.fb_plugin is not None:
            shape, config = self._meta(case, self.fb_layout(case))
            try:
                if self.fb_plugin.supports(shape, config):
                    return "plugin"
            except Exception:
                pass
        if self.host is None or case.swizzle or case.limit is not None:
            return None
        return "raw"

    def run_fb(self, gateup, masked_m, outputs, case, via):
        if via == "plugin":
            shape, config = self.shape_config(gateup, masked_m, case, self.fb_layout(case))
            from ..plugins.sglang_kernels.host import use_host_kernels

            with use_host_kernels(self.host):
                self.fb_plugin.run(SiluMulQuantInputs(gateup, masked_m), outputs, shape, config)
            return
        self.host.per_token_group_quant(
            gateup,
            outputs.out,
            outputs.scale,
            case.gs,
            scale_ue8m0=case.ue8m0,
            fuse_silu_and_mul=True,
            masked_m=masked_m,
        )
