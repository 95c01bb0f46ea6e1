#!/usr/bin/env bash
# The fluid model (megakernel.fluid, via benchmarks.schedule_model --fluid) on session AE call 4's batch-1 and
# batch-8 default rows (their per-wave costs), for the schedules whose A/Bs were measured; CPU only, ~5 min.
set -euo pipefail
tmp=$(mktemp -d)
tar xJf benchmarks/results/h200-2026-12-04-v2-session-ae/raw.tar.xz -C "$tmp" call4-posted-routing/profile/profile.json
python -m benchmarks.schedule_model --fluid --model configs/north-mini-code \
  --profile "$tmp/call4-posted-routing/profile/profile.json" --batch-sizes 1,8 \
  --schedules "default;stages_in_flight=1;stages_in_flight=3;stages_in_flight=4;moe_up_cols=48;moe_up_cols=24;split_order=live_first,attn_live_tasks=48;attn_live_tasks=96;local_routing=1;posted_routing=1;o_within_down=0.5;combine_place=empty_splits"
