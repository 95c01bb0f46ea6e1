#!/usr/bin/env bash
# On the GPU host: unpack the compute-sanitizer wheel a call carries in .sanitizer/ (the host has no
# compute-sanitizer of its own) and print the path of its binary, for COMPUTE_SANITIZER:
#   cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
# Every device call that ran a sanitizer so far unpacked it with these same lines, written into each script.
set -euo pipefail
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d
python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13
echo $d/nvidia/cu13/bin/compute-sanitizer
