#!/usr/bin/env bash
# Builds an offline bundle that carries vLLM 0.24.0, lm-eval 0.4.13 and this project to an air-gapped GPU
# host whose Python 3.12 already has torch 2.11.0 (+cu130), triton, transformers and the usual scientific
# stack, plus nvcc, cmake, pybind11 and scikit-build-core to compile csrc/ there.
#
#   bash tools/offline_bundle/build.sh OUT_DIR     # needs a package index; a few minutes on 2 cores
#
# OUT_DIR receives p0/ p1/ ... (pieces of one xz archive, each PIECE_MIB so that a piece plus the source tree
# -- 17 MB with its committed results in session L, where 48 MiB pieces no longer fit, 27 MiB in session AA,
# where 36 MiB pieces no longer did, 32.9 MiB in session AU, where 27 MiB pieces left under 4 MiB for results;
# tests/cpu/test_offline_bundle.py keeps the sum under 64 MiB -- makes one 64 MiB transfer), install.sh, env.sh
# and bundle.sha256. On the host: copy every piece's files into one folder (install.sh --stash DIR does it, one
# piece at a time), then run install.sh, which unpacks into /tmp/site, installs this project from the shipped
# source with its CUDA extension, and checks that vllm, lm_eval and vllm_megakernel import.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"; out=$(cd "$out" && pwd)
work=${OFFLINE_BUNDLE_WORK:-/tmp/offline-bundle-work}
rm -rf "$work/site"; mkdir -p "$work/wheels" "$work/site"
plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for t in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1 \
         manylinux_2_5 manylinux_2_31 manylinux_2_34; do
  plat="$plat --platform ${t}_x86_64"
done

echo "== wheels for python 3.12 (cached in $work)"
for req in requirements-vllm.txt requirements-vllm-extra.txt requirements-eval.txt; do
  python3 -m pip download -q --no-deps $plat -d "$work/wheels" -r "$here/$req"
done
python3 -m pip wheel -q --no-deps -w "$work/wheels" -r "$here/requirements-eval-sdist.txt"

echo "== site tree"
python3 -m pip install -q --no-deps --no-compile $plat --target "$work/site" "$work"/wheels/*.whl
# Hopper runs FlashAttention 3; the FA2 library, the Rust frontend and other-arch kernels are never loaded.
( cd "$work/site/vllm" && rm -f vllm_flash_attn/_vllm_fa2_C.abi3.so vllm-rs \
    third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so && rm -rf third_party/fmha_sm100/cutlass )
rm -f "$work/site/xgrammar/lib/libxgrammar.a"  # static library, unused at run time
echo "== this project's source (built with its CUDA extension on the host)"
mkdir -p "$work/site/_vllm_megakernel_src"
git -C "$repo" archive HEAD | tar -x -C "$work/site/_vllm_megakernel_src"

echo "== compress and split"
PIECE_MIB=23  # read by tests/cpu/test_offline_bundle.py
rm -rf "$out"/p[0-9]*
tar -C "$work" -cf - site | xz -T0 -6 > "$work/site.tar.xz"
( cd "$work" && sha256sum site.tar.xz > "$out/bundle.sha256" )
( cd "$out" && split -b ${PIECE_MIB}M -d -a 2 "$work/site.tar.xz" bundle.part )
n=0
for f in "$out"/bundle.part*; do mkdir -p "$out/p$n"; mv "$f" "$out/p$n/"; n=$((n+1)); done
cp "$here/install.sh" "$here/env.sh" "$out/"
rm -f "$work/site.tar.xz"
echo "== done: $n pieces"
du -sh "$out"/p*
