#!/usr/bin/env bash
# On the GPU host. Two forms:
#   bash install.sh --stash DIR   append the pieces found in DIR to /tmp/offline-bundle-parts
#   bash install.sh               reassemble, check the checksum, unpack into /tmp/site (once), build and
#                                 install vllm_megakernel from the shipped source, check the imports
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
parts=/tmp/offline-bundle-parts
mkdir -p "$parts"
if [[ ${1:-} == --stash ]]; then
  cp "${2:?usage: install.sh --stash DIR}"/* "$parts/"
  ls -la "$parts"
  exit 0
fi
if [[ ! -d /tmp/site/vllm ]]; then
  cat "$parts"/bundle.part* > /tmp/site.tar.xz
  ( cd /tmp && echo "$(cut -d' ' -f1 "$here/bundle.sha256")  site.tar.xz" | sha256sum -c - )
  tar -C /tmp -xJf /tmp/site.tar.xz
  rm -f /tmp/site.tar.xz
fi
source "$here/env.sh"
# The checks run from / so that a vllm_megakernel source folder in the caller's directory (a checkout)
# cannot stand in for the installed package.
if ! (cd / && python3 -c "import vllm_megakernel._C") 2>/dev/null; then
  python3 -m pip install -q --no-build-isolation --no-deps --no-index /tmp/site/_vllm_megakernel_src
fi
(cd / && python3 -c "import vllm, lm_eval, torch, vllm_megakernel._C as c; print('vllm', vllm.__version__, 'lm_eval', \
lm_eval.__version__, 'torch', torch.__version__, 'extension', c.build_info(), 'gpu', torch.cuda.get_device_name())")
