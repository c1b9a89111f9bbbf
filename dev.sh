#!/usr/bin/env bash
# Set up this checkout on a fresh machine and run the demo or the tests.
#   ./dev.sh demo      SGLang's real load_plugins() + hooked MoE functions on the embedded model catalog
#   ./dev.sh test      the test suite on sglang 0.5.23 (CPU; GPU tests skip without CUDA), then the SGLang
#                      integration tests (marker `sglang`) again on an older release, $OLD_SGLANG (0.5.19)
#   ./dev.sh test-old  only the SGLang integration tests on $OLD_SGLANG
#   ./dev.sh lint      ruff format --check, ruff check and mypy (pyproject.toml's [tool.ruff] and [tool.mypy])
#   ./dev.sh setup     only create .venv with sglang==0.5.23, this package (extras sglang, test, lint) and the example plugin,
#                      and .venv-sglang-$OLD_SGLANG (see README, "Supported SGLang releases")
# OLD_SGLANG= (empty) skips the older release.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
OLD_SGLANG=${OLD_SGLANG-0.5.19}
# The older release's own pins of the packages whose 0.5.23 versions it cannot import with.
OLD_PINS=${OLD_PINS:-"transformers==5.12.1 tokenizers==0.22.2"}
OLD_VENV=.venv-sglang-$OLD_SGLANG

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "import sglang_moe_plugins, sglang, pytest" 2>/dev/null \
        || [ ! -x "$VENV/bin/ruff" ] || [ ! -x "$VENV/bin/mypy" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
        "$VENV/bin/python" -m pip install -q --upgrade pip
        "$VENV/bin/python" -m pip install -q -e ".[sglang,test,lint]" "sglang==0.5.23"
        if [ -d examples/sglang-moe-example-plugin ]; then
            "$VENV/bin/python" -m pip install -q -e examples/sglang-moe-example-plugin
        fi
        touch "$VENV/.installed"
    fi
    [ -z "$OLD_SGLANG" ] || setup_old
}

# The older release cannot be installed with its dependencies here (0.5.18-0.5.22 pin cuda-tile==1.6.0rc5,
# a placeholder that downloads from NVIDIA's index). Its venv holds only sglang==$OLD_SGLANG and its own
# $OLD_PINS (installed --no-deps), and a .pth file that appends the first venv's site-packages (torch,
# sgl-deep-gemm, this package, pytest...): its own packages come first on sys.path and shadow those.
setup_old() {
    if [ ! -x "$OLD_VENV/bin/python" ]; then
        "$PYTHON" -m venv --without-pip "$OLD_VENV"
    fi
    local base own
    base=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    own=$("$OLD_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "import site; site.addsitedir('$base')" > "$own/zz_base_venv.pth"
    if ! "$OLD_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '$OLD_SGLANG')" 2>/dev/null; then
        # shellcheck disable=SC2086
        "$VENV/bin/python" -m pip install -q --upgrade --no-deps --target "$own" "sglang==$OLD_SGLANG" $OLD_PINS
    fi
}

# The whole tree, formatted and linted; mypy checks the package (its files and strictness: pyproject.toml).
lint() {
    local rc=0 paths=(sglang_moe_plugins tests benchmarks examples)
    "$VENV/bin/ruff" format --check "${paths[@]}" || rc=$?
    "$VENV/bin/ruff" check "${paths[@]}" || rc=$?
    "$VENV/bin/mypy" || rc=$?
    return $rc
}

pytest_args=(-q -p no:cacheprovider)
case "${1:-test}" in
    setup) setup ;;
    demo) setup; shift; exec "$VENV/bin/python" -m sglang_moe_plugins.demo "$@" ;;
    test)
        setup; shift || true
        rc=0
        "$VENV/bin/python" -m pytest "${pytest_args[@]}" tests examples/sglang-moe-example-plugin/tests "$@" || rc=$?
        if [ -n "$OLD_SGLANG" ]; then
            echo "== SGLang integration tests on sglang $OLD_SGLANG ($OLD_VENV)"
            "$OLD_VENV/bin/python" -m pytest "${pytest_args[@]}" -m sglang tests || rc=$?
        fi
        exit $rc ;;
    test-old) setup; shift; exec "$OLD_VENV/bin/python" -m pytest "${pytest_args[@]}" -m sglang tests "$@" ;;
    lint) setup; lint ;;
    *) echo "usage: ./dev.sh [setup|demo|test|test-old|lint]" >&2; exit 2 ;;
esac
