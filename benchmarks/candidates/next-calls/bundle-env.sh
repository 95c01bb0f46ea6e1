# Sourced by the next-call scripts that run inside vLLM: `source benchmarks/candidates/next-calls/bundle-env.sh LOGDIR`.
# Installs the offline bundle stashed on this machine (logged to LOGDIR/install.txt) and puts this checkout and the
# bundle on the path. A machine handed back between the stash calls and this one comes back bare: then this stops the
# calling script (exit 3) with a message, rather than letting its tests fail on importing vllm (session AJ lost a
# call so).
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > "$1/install.txt" 2>&1
bundle_rc=$?; echo "install rc=$bundle_rc"
[ $bundle_rc -eq 0 ] || { tail -3 "$1/install.txt"; echo "no bundle on this machine: stash every piece again"; exit 3; }
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
