#!/usr/bin/env bash
# Set up this checkout on a fresh machine and run the demo or the tests.
#   ./dev.sh demo     SGLang's real load_plugins() + hooked MoE functions on the embedded model catalog
#   ./dev.sh test     the test suite (CPU; GPU tests skip without CUDA)
#   ./dev.sh setup    only create .venv with sglang==0.5.23, this package and the example plugin
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "import sglang_moe_plugins, sglang, pytest" 2>/dev/null \
        || [ pyproject.toml -nt "$VENV/.installed" ]; then
        "$VENV/bin/python" -m pip install -q --upgrade pip
        "$VENV/bin/python" -m pip install -q -e ".[sglang,test]"
        if [ -d examples/sglang-moe-example-plugin ]; then
            "$VENV/bin/python" -m pip install -q -e examples/sglang-moe-example-plugin
        fi
        touch "$VENV/.installed"
    fi
}

case "${1:-test}" in
    setup) setup ;;
    demo) setup; shift; exec "$VENV/bin/python" -m sglang_moe_plugins.demo "$@" ;;
    test) setup; shift; exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests examples/sglang-moe-example-plugin/tests "$@" ;;
    *) echo "usage: ./dev.sh [setup|demo|test]" >&2; exit 2 ;;
esac
