# source me on the GPU host after install.sh: the bundle's site tree on the path, no network, no telemetry.
export PYTHONPATH=${OFFLINE_BUNDLE_ROOT:-/tmp}/site${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# FlashInfer is not in the bundle (Hopper uses FlashAttention 3 and Triton MoE); xgrammar's FFI must not compile.
export VLLM_USE_FLASHINFER_SAMPLER=0 TVM_FFI_DISABLE_TORCH_C_DLPACK=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
