#!/usr/bin/env bash
# Kernel A/B, step 1 (the CPU machine): build one extension per variant, each the commit's csrc/ plus
# patches, for the GPU host's Python, into DIR/NAME.so. Step 2 is run.sh on the GPU host.
#
#   PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh DIR [REV] NAME[=PATCH[,PATCH...]] ...
#
# REV (default HEAD) is the commit whose csrc/ every variant starts from; a NAME without patches is that
# commit as it is (the base). PYTHON must have pybind11 (cmake on PATH, ninja if there), and match the GPU host's Python
# (the .so's tag; e.g. cpython-312). Each variant builds in its own tree under $AB_BUILD_DIR/NAME (default
# /tmp/ab-build), so DIR holds only the .so files that travel to the GPU host, and a rebuild after a patch
# changes recompiles only that variant.
set -euo pipefail
out=${1:?usage: build.sh DIR [REV] NAME[=PATCH,...] ...}; shift
rev=HEAD
if [[ $# -gt 0 && $1 != *=* ]] && git rev-parse -q --verify "$1^{commit}" >/dev/null 2>&1; then rev=$1; shift; fi
py=${PYTHON:-python3}
repo=$(git rev-parse --show-toplevel)
mkdir -p "$out"; out=$(cd "$out" && pwd)
tag=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for spec in "$@"; do
  name=${spec%%=*}; patches=; [[ $spec == *=* ]] && patches=${spec#*=}
  work=${AB_BUILD_DIR:-/tmp/ab-build}/$name
  src=$work/src; rm -rf "$src"; mkdir -p "$src"
  git -C "$repo" archive "$rev" csrc CMakeLists.txt | tar -x -C "$src"
  IFS=, read -ra list <<< "$patches"
  # only the kernel's hunks: a candidate may also touch the simulator and tests, which the A/B does not run
  # (one that changes the ABI needs the Python side too: run it from a patched checkout instead)
  for p in "${list[@]}"; do (cd "$src" && git apply --include='csrc/*' --include=CMakeLists.txt "$(cd "$repo" && realpath "$p")"); done
  bld=$work/cmake
  if [[ ! -f $bld/build.ninja ]]; then
    gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
    cmake -S "$src" -B "$bld" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" \
      -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" -DSKBUILD_PROJECT_VERSION=0.1.0 > /dev/null
  fi
  cmake --build "$bld" > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
  cp "$bld/_C$tag" "$out/$name.so"
  echo "$name: $rev${patches:+ + $patches} -> $out/$name.so"
done
