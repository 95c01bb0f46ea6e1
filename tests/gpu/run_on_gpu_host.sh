#!/usr/bin/env bash
# On a GPU host that has vLLM 0.24.0 importable (e.g. through shared/gpu-bundle's env.sh): build the
# extension in place and run the GPU tests. Extra arguments go to pytest (e.g. -k serve).
# Logs go to $OUT when it is set (the device tool's output folder), else to ./out.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}; mkdir -p "$out"
python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
python3 -c "from vllm_megakernel import _C; print(_C.build_info(), _C.query_device(0))"
python3 -m pytest tests/gpu -v -rA -p no:cacheprovider "$@" 2>&1 | tee "$out/gpu-tests.log"
exit "${PIPESTATUS[0]}"
