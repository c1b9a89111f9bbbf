"""``SGLANG_MOE_PLUGINS_ENABLE`` / ``_FORCE`` / ``_PRIORITY``: the variables the ``--moe-plugins-enable/force/priority``
server arguments set (integrations/sglang/server_args.py) are read by ``load_config`` over the file's values."""

from __future__ import annotations

import pytest

from sglang_moe_plugins.config import load_config
from sglang_moe_plugins.errors import ConfigError


def test_enable_force_and_priority_variables_apply_over_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('enable = ["example_torch"]\n[force]\nmega_moe = "mega_reference"\n[priority]\nreference = 3\n')
    config = load_config(
        {
            "SGLANG_MOE_PLUGINS_CONFIG": str(path),
            "SGLANG_MOE_PLUGINS_ENABLE": "triton",
            "SGLANG_MOE_PLUGINS_FORCE": "silu_mul_quant=reference",
            "SGLANG_MOE_PLUGINS_PRIORITY": "reference=7,triton=-2",
        }
    )
    assert set(config.enable) == {"example_torch", "triton"}
    assert dict(config.force) == {"mega_moe": "mega_reference", "silu_mul_quant": "reference"}
    assert dict(config.priority) == {"reference": 7, "triton": -2}


def test_empty_variables_are_unset():
    config = load_config({"SGLANG_MOE_PLUGINS_FORCE": " ", "SGLANG_MOE_PLUGINS_PRIORITY": ""})
    assert dict(config.force) == {} and dict(config.priority) == {}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SGLANG_MOE_PLUGINS_FORCE", "silu_mul_quant"),
        ("SGLANG_MOE_PLUGINS_PRIORITY", "reference=high"),
        ("SGLANG_MOE_PLUGINS_ENABLE", "a b"),
    ],
)
def test_a_malformed_variable_is_a_config_error_naming_it(name, value):
    with pytest.raises(ConfigError) as info:
        load_config({name: value})
    assert name in str(info.value) and repr(value) in str(info.value)
