"""The launch's ``pre_dispatch="triton"`` path: one prepared launcher per symmetric buffer, the host's
top-k dtypes passed as they are (int64 ids, bf16 weights: no per-call copy), ``None`` at T == 0.

The prepared launcher is replaced by a recorder that writes what ``pre_dispatch_reference`` writes (the
launcher's own numerics are tested under Triton's interpreter and on the GPU); deep_gemm's functions
are the recording fakes of tests/test_mega_deep_gemm_call.py (checked against the real signatures).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _mega_cases import API_MMA_TYPE, make_problem

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.ops.mega_moe import formats as nm
from sglang_moe_plugins.plugins.deep_gemm import plugin as mdg, pre_dispatch_triton as triton_mod

pytest.importorskip("triton")
from test_mega_deep_gemm_call import FakeGroup, Recorder, _assert_buffer, _expected_buffer


class _Launchers:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built: list[dict] = []
        self.calls: list[tuple] = []
        monkeypatch.setattr(triton_mod, "prepare_pre_dispatch", self.prepare)

    def prepare(self, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, **options):  # type: ignore[no-untyped-def]
        self.built.append(dict(options, buffers=(buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights)))

        def launcher(x, topk_ids, topk_weights):  # type: ignore[no-untyped-def]
            self.calls.append((x, topk_ids, topk_weights))
            nm.pre_dispatch_reference(
                x, topk_ids, topk_weights, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, **options
            )

        return launcher


def _run_repeatedly(plugin, problem, platform, times: int):  # type: ignore[no-untyped-def]
    plugin.options = {"pre_dispatch": "triton"}
    config = dataclasses.replace(problem.config, platform=platform)
    inputs = dataclasses.replace(problem.inputs, ep_group=FakeGroup())
    assert plugin.supports(problem.shape, config), plugin.supports(problem.shape, config).reason
    launch = plugin.prepare(problem.shape, config)
    outputs = None
    for _ in range(times):
        outputs = mm.allocate_outputs(problem.shape, config, inputs.device, num_tokens=inputs.num_tokens)
        launch(inputs, outputs)
    return inputs, outputs


@pytest.mark.parametrize(
    "variant, plugin, platform, sm90",
    [
        ("fp8xfp4", mdg.MegaW4A8Plugin, Platform.cuda(10, 0), False),
        ("sm90_fp8", mdg.MegaSm90Fp8Plugin, Platform.cuda(9, 0), True),
    ],
)
def test_one_launcher_per_buffer_and_host_dtypes_as_they_are(
    monkeypatch: pytest.MonkeyPatch, variant, plugin, platform, sm90
) -> None:
    rec = Recorder(monkeypatch, sm90=sm90)
    launchers = _Launchers(monkeypatch)
    problem = make_problem(variant, rsf=2.5, seed=31)
    i = problem.inputs
    ids64, w16 = i.topk_ids.to(torch.int64), i.topk_weights.to(torch.bfloat16)
    problem = dataclasses.replace(problem, inputs=dataclasses.replace(i, topk_ids=ids64, topk_weights=w16))
    inputs, _ = _run_repeatedly(plugin(API_MMA_TYPE), problem, platform, times=3)
    (_buffer_call,) = rec.named("get_symm_buffer_for_mega_moe")
    (built,) = launchers.built  # once, for the one buffer
    assert built["variant"] == variant and built["routed_scaling_factor"] == 2.5 and built["shared_x_sf"] is None
    assert len(launchers.calls) == 3
    for x, ids, weights in launchers.calls:  # the host's tensors themselves: no int32 / fp32 copy per call
        assert x is inputs.hidden_states and ids is ids64 and weights is w16
    want = dataclasses.replace(problem, inputs=dataclasses.replace(problem.inputs, topk_ids=ids64, topk_weights=w16))
    _assert_buffer(rec.snapshots["buffer"], _expected_buffer(want, variant, 2.5))


def test_other_dtypes_are_converted_and_zero_tokens_pass_none(monkeypatch: pytest.MonkeyPatch) -> None:
    Recorder(monkeypatch)
    launchers = _Launchers(monkeypatch)
    problem = make_problem("fp8xfp4", seed=32)
    i = problem.inputs
    half = dataclasses.replace(problem, inputs=dataclasses.replace(i, topk_weights=i.topk_weights.to(torch.float16)))
    _run_repeatedly(mdg.MegaW4A8Plugin(API_MMA_TYPE), half, Platform.cuda(10, 0), times=1)
    ((_, ids, weights),) = launchers.calls
    assert weights.dtype == torch.float32 and torch.equal(weights, i.topk_weights.to(torch.float16).float())
    assert ids.dtype in (torch.int32, torch.int64)

    launchers.calls.clear()
    empty = make_problem("fp8xfp4", tokens=0, seed=33)
    empty = dataclasses.replace(empty, inputs=dataclasses.replace(empty.inputs, topk_ids=None, topk_weights=None))
    _run_repeatedly(mdg.MegaW4A8Plugin(API_MMA_TYPE), empty, Platform.cuda(10, 0), times=2)
    assert [(ids, weights) for _, ids, weights in launchers.calls] == [(None, None), (None, None)]
