"""The shapes and tiling sweeps of ``benchmarks/mega_pre_dispatch.py`` (:mod:`.mega_pre_dispatch` times
them): the variants with their group sizes and output bytes, the buffer's rows, and each ``--sweep-set``'s
(variant, tokens, hidden, tilings). Public through :mod:`.mega_pre_dispatch`."""

from __future__ import annotations

from typing import Any

__all__ = ["VARIANTS", "ROWS", "TOP_K", "SHAPES", "SWEEP_SETS"]


VARIANTS = {"fp8xfp4": (32, 1.0), "mxf4xmxf4": (32, 0.5), "sm90_fp8": (128, 1.0)}  # group, output bytes/elem


ROWS = 8192  # SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK default: the buffer's P


TOP_K = 6  # DeepSeek-V4 (routed only)


SHAPES = [
    (1, 4096),
    (16, 4096),
    (64, 4096),
    (64, 7168),
    (512, 4096),
    (2048, 4096),
    (2048, 7168),
    (8192, 4096),
    (8192, 7168),
]


SWEEP_LARGE = [(2, 1024, 4), (4, 1024, 4), (8, 1024, 4), (8, 1024, 8), (8, 512, 4), (16, 512, 4), (4, 2048, 8)]


SWEEP_SMALL = [(1, 1024, 4), (2, 1024, 4), (4, 1024, 4), (2, 512, 4), (1, 512, 4)]


SWEEP_MID = [
    (2, 1024, 4),
    (4, 512, 4),
    (4, 1024, 4),
    (4, 1024, 8),
    (1, 2048, 8),
    (2, 2048, 8),
    (1, 4096, 8),
    (8, 1024, 8),
    (1, 4096, 16),
    (2, 4096, 16),
    (1, 8192, 16),
]


SWEEP_SMALL2 = [(1, 1024, 4), (2, 512, 4), (4, 1024, 4), (1, 2048, 8), (1, 4096, 16), (2, 4096, 16)]


#: session 3: the L2 hint on the x loads (4th element: evict_first), at T = 512 where SGLang's kernel led
SWEEP_EVICT = [
    (2, 2048, 8, True),
    (2, 2048, 8, False),
    (1, 4096, 16, True),
    (1, 4096, 16, False),
    (4, 512, 4, True),
    (4, 512, 4, False),
    (4, 1024, 4, True),
    (4, 1024, 4, False),
]


SWEEP_EVICT_SMALL = [(2, 1024, 4, True), (2, 1024, 4, False), (1, 1024, 4, True), (1, 1024, 4, False)]


#: session 3, after sweep 3: more tile shapes (incl. 2 warps) where SGLang's kernel was at parity or ahead
SWEEP_512 = [
    (4, 1024, 4),
    (8, 1024, 8),
    (4, 2048, 8),
    (8, 512, 4),
    (4, 1024, 2),
    (2, 1024, 2),
    (8, 1024, 4),
    (16, 512, 8),
    (4, 4096, 16),
    (2, 512, 2),
]


SWEEP_64 = [
    (2, 1024, 4),
    (2, 1024, 2),
    (1, 1024, 2),
    (4, 1024, 4),
    (2, 2048, 4),
    (1, 2048, 4),
    (1, 4096, 8),
    (2, 512, 2),
    (1, 512, 2),
]


#: (variant, tokens, hidden, tilings) of the sweep; ``--sweep-set 1`` is the first session's sweep
SWEEP_SETS: dict[str, list[tuple[str, int, int, list[Any]]]] = {
    "1": [
        (v, t, h, tl)
        for v in ("fp8xfp4", "mxf4xmxf4")
        for t, h, tl in [(8192, 4096, SWEEP_LARGE), (64, 7168, SWEEP_SMALL), (1, 4096, SWEEP_SMALL)]
    ],
    "2": [
        (v, t, h, tl)
        for v in ("fp8xfp4", "sm90_fp8", "mxf4xmxf4")
        for t, h, tl in [
            (512, 4096, SWEEP_MID),
            (64, 4096, SWEEP_SMALL2),
            (2048, 7168, SWEEP_MID),
            (8192, 4096, SWEEP_MID),
        ]
    ],
    "3": [
        (v, t, h, tl)
        for v in ("fp8xfp4", "sm90_fp8", "mxf4xmxf4")
        for t, h, tl in [
            (512, 4096, SWEEP_EVICT),
            (256, 4096, SWEEP_EVICT),
            (1024, 4096, SWEEP_EVICT),
            (2048, 7168, SWEEP_EVICT),
            (8192, 4096, SWEEP_EVICT),
            (64, 4096, SWEEP_EVICT_SMALL),
        ]
    ],
    "4": [
        ("fp8xfp4", t, h, tl)
        for t, h, tl in [(512, 4096, SWEEP_512), (64, 4096, SWEEP_64), (256, 4096, SWEEP_512), (512, 7168, SWEEP_512)]
    ],
}
