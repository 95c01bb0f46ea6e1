#!/usr/bin/env bash
# On the GPU host. Three forms:
#   bash install.sh --stash DIR   append the pieces found in DIR to /tmp/offline-bundle-parts
#   bash install.sh               reassemble, check the checksum, unpack into /tmp/site (once), build and
#                                 install vllm_megakernel from the shipped source, check the imports
#   bash install.sh --no-project [CHECKOUT]
#                                 the same without building the shipped source, for a caller that puts its own
#                                 checkout (default: the current directory; its extension built elsewhere) on
#                                 PYTHONPATH: compiling csrc/ there costs device time and is not what runs. The
#                                 checkout's entry points (vLLM finds its plugins by them) go into a dist-info
#                                 next to the bundle's packages, so that vLLM loads the checkout as its plugin
# OFFLINE_BUNDLE_PARTS and OFFLINE_BUNDLE_ROOT move /tmp/offline-bundle-parts and /tmp (the CPU test does).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
parts=${OFFLINE_BUNDLE_PARTS:-/tmp/offline-bundle-parts}
root=${OFFLINE_BUNDLE_ROOT:-/tmp}
mkdir -p "$parts"
if [[ ${1:-} == --stash ]]; then
  cp "${2:?usage: install.sh --stash DIR}"/* "$parts/"
  ls -la "$parts"
  exit 0
fi
project=1
if [[ ${1:-} == --no-project ]]; then
  project=0
  checkout=$(cd "${2:-.}" && pwd)
elif [[ -n ${1:-} ]]; then
  echo "usage: install.sh [--stash DIR | --no-project [CHECKOUT]]" >&2
  exit 2
fi
if [[ ! -d $root/site/vllm ]]; then
  # a machine handed back after the stash calls comes back without the pieces: say so, not cat's glob error
  compgen -G "$parts/bundle.part*" > /dev/null \
    || { echo "install.sh: no bundle pieces in $parts: run install.sh --stash DIR for each piece first" >&2; exit 3; }
  cat "$parts"/bundle.part* > "$root/site.tar.xz"
  ( cd "$root" && echo "$(cut -d' ' -f1 "$here/bundle.sha256")  site.tar.xz" | sha256sum -c - )
  # build.sh compresses with xz -T0 (several blocks): xz 5.4 and newer decompress those in parallel
  xz -d -T0 -c "$root/site.tar.xz" | tar -C "$root" -x
  rm -f "$root/site.tar.xz"
fi
export OFFLINE_BUNDLE_ROOT=$root
source "$here/env.sh"
gpu="torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'"
if (( project )); then
  # The checks run from / so that a vllm_megakernel source folder in the caller's directory (a checkout)
  # cannot stand in for the installed package.
  if ! (cd / && python3 -c "import vllm_megakernel._C") 2>/dev/null; then
    python3 -m pip install -q --no-build-isolation --no-deps --no-index "$root/site/_vllm_megakernel_src"
  fi
  (cd / && python3 -c "import vllm, lm_eval, torch, vllm_megakernel._C as c; print('vllm', vllm.__version__, \
'lm_eval', lm_eval.__version__, 'torch', torch.__version__, 'extension', c.build_info(), 'gpu', $gpu)")
else
  python3 - "$checkout/pyproject.toml" "$root/site" <<'PY'
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path(sys.argv[1]).read_text())["project"]
info = pathlib.Path(sys.argv[2]) / f"{project['name']}-{project['version']}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
    for group, points in project.get("entry-points", {}).items()))
PY
  (cd / && python3 -c "import vllm, lm_eval, torch, importlib.metadata as m; print('vllm', vllm.__version__, \
'lm_eval', lm_eval.__version__, 'torch', torch.__version__, 'gpu', $gpu, '(this project: not built from the bundle)', \
'plugins:', sorted(f'{e.name} = {e.value}' for e in m.entry_points(group='vllm.general_plugins')))")
fi
