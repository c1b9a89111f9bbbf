#!/usr/bin/env bash
# Set up this checkout on a fresh machine and run the demo or the tests.
#   ./dev.sh demo      SGLang's real load_plugins() + hooked MoE functions on the embedded model catalog
#   ./dev.sh demo-all  the demo on sglang 0.5.23 (.venv), then on each older release of $OLD_SGLANG
#   ./dev.sh test      the test suite on sglang 0.5.23 (CPU; GPU tests skip without CUDA), then the SGLang
#                      integration tests (marker `sglang`) again on each older release of $OLD_SGLANG
#                      (0.5.19: the masked crash releases; 0.5.20: the first with the compact-layout guard).
#                      The suite runs the demo on 0.5.23 and on each of those releases (tests/test_demo_releases.py)
#   ./dev.sh test-old  only the SGLang integration tests on the releases of $OLD_SGLANG (not the demo)
#   ./dev.sh lint      ruff format --check, ruff check and mypy (pyproject.toml's [tool.ruff] and [tool.mypy])
#   ./dev.sh setup     only create .venv with sglang==0.5.23, this package (extras sglang, test, lint) and the example plugin,
#                      and .venv-sglang-<release> for each of $OLD_SGLANG (CONTRIBUTING.md, "The older SGLang environments")
# OLD_SGLANG= (empty) skips the older releases; OLD_SGLANG=0.5.20 runs one.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
OLD_SGLANG=${OLD_SGLANG-0.5.19 0.5.20}
# The older releases' own pins of the packages whose 0.5.23 versions they cannot import with (0.5.19 and 0.5.20
# pin the same ones).
OLD_PINS=${OLD_PINS:-"transformers==5.12.1 tokenizers==0.22.2"}

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
    local release
    for release in $OLD_SGLANG; do setup_old "$release"; done
}

# The older release cannot be installed with its dependencies here (0.5.18-0.5.22 pin cuda-tile==1.6.0rc5,
# a placeholder that downloads from NVIDIA's index). Its venv holds only sglang==$OLD_SGLANG and its own
# $OLD_PINS (installed --no-deps), and a .pth file that appends the first venv's site-packages (torch,
# sgl-deep-gemm, this package, pytest...): its own packages come first on sys.path and shadow those.
setup_old() {
    local release=$1 venv=.venv-sglang-$1 base own
    if [ ! -x "$venv/bin/python" ]; then
        "$PYTHON" -m venv --without-pip "$venv"
    fi
    base=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    own=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "import site; site.addsitedir('$base')" > "$own/zz_base_venv.pth"
    if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '$release')" 2>/dev/null; then
        # shellcheck disable=SC2086
        "$VENV/bin/python" -m pip install -q --upgrade --no-deps --target "$own" "sglang==$release" $OLD_PINS
    fi
}

# The SGLang integration tests (marker sglang) on each older release of $OLD_SGLANG; non-zero if any failed.
# Without tests/test_demo_releases.py: the suite's run on .venv starts the demo in each of these environments
# itself (once per release in CI; the demo costs about 40 s of CPU per release).
# Releases of $OLD_SGLANG whose run is cut to the files where releases differ (CI's 90 minutes): the hooks, the
# release tables, the rollback and the server arguments. The others run every SGLang test.
OLD_SGLANG_SHORT=${OLD_SGLANG_SHORT-0.5.20}
SHORT_TESTS=(tests/test_sglang_integration.py tests/test_contig_host.py tests/test_masked_layout_guard.py
    tests/test_sglang_releases.py tests/test_sglang_releases_contig.py tests/test_failure_policy.py
    tests/test_operator_rollback.py tests/test_server_args.py tests/test_redteam2_faults.py)
test_old() {
    local release rc=0
    for release in $OLD_SGLANG; do
        local files=(tests)
        if [[ " $OLD_SGLANG_SHORT " == *" $release "* && $# -eq 0 ]]; then files=("${SHORT_TESTS[@]}"); fi
        echo "== SGLang integration tests on sglang $release (.venv-sglang-$release): ${files[*]}"
        ".venv-sglang-$release/bin/python" -m pytest "${pytest_args[@]}" -m sglang \
            --ignore=tests/test_demo_releases.py "${files[@]}" "$@" || rc=$?
    done
    return $rc
}

# The demo on .venv, then on each older release of $OLD_SGLANG; non-zero if it failed on any.
demo_all() {
    local release rc=0
    echo "== demo on $("$VENV/bin/python" -c "import importlib.metadata as m; print('sglang', m.version('sglang'))") ($VENV)"
    "$VENV/bin/python" -m sglang_moe_plugins.demo "$@" || rc=$?
    for release in $OLD_SGLANG; do
        echo "== demo on sglang $release (.venv-sglang-$release)"
        ".venv-sglang-$release/bin/python" -m sglang_moe_plugins.demo "$@" || rc=$?
    done
    return $rc
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
    demo-all) setup; shift; demo_all "$@" ;;
    test)
        setup; shift || true
        rc=0
        "$VENV/bin/python" -m pytest "${pytest_args[@]}" tests examples/sglang-moe-example-plugin/tests "$@" || rc=$?
        test_old || rc=$?
        exit $rc ;;
    test-old) setup; shift; test_old "$@" ;;
    lint) setup; lint ;;
    *) echo "usage: ./dev.sh [setup|demo|demo-all|test|test-old|lint]" >&2; exit 2 ;;
esac
