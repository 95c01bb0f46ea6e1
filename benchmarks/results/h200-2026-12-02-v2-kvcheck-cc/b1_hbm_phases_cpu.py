# Session O, CPU: python benchmarks/results/h200-2026-12-02-v2-kvcheck-cc/b1_hbm_phases_cpu.py (checkout root, CPU venv)
# A crude picture of how busy HBM is through batch 1's MoE layer: each streaming wave's bytes per layer
# (kernel_profile.wave_bytes: every weight and K/V byte once) spread evenly over the wave's span in the layer
# timeline (first task run .. last task end, medians over MoE layers 2-46) of call 1's traces, summed in 5 us
# bins, against the copy bandwidth measured in the same run. Crude: the producers stream a task's first stages
# before the task runs (up to the 6-stage ring), so bytes sit earlier than drawn; the sums are right, the bins
# are not exact.
import json
import numpy as np
from benchmarks.kernel_profile import wave_bytes
for run in ("base-1", "cc-2", "fa-4"):
    p = json.load(open(f"benchmarks/results/h200-2026-12-02-v2-kvcheck-cc/call1/ab/{run}/profile.json"))
    r = [x for x in p["results"] if x["batch"] == 1][0]
    cfg, bw = p["config"], p["bandwidth_bytes_per_s"] / 1e12  # TB/s = MB/us
    tl = {w["wave"]: w for w in r["timeline"]["waves"]}
    mb = {w: wave_bytes(cfg, w, 8192, 1, r["distinct_experts"]) / 1e6 for w in tl}
    T = r["timeline"]["next_layer_us"]
    bins = np.arange(0, T + 5, 5.0)
    load = np.zeros(len(bins) - 1)
    for w, d in tl.items():
        if mb[w]:
            a, b = d["first_run_us"], d["last_end_us"]
            for i in range(len(bins) - 1):
                lo, hi = max(a, bins[i]), min(b, bins[i + 1])
                if hi > lo:
                    load[i] += mb[w] * (hi - lo) / (b - a)
    print(f"{run}: layer {T:.1f} us, its bytes {sum(mb.values()):.1f} MB = {sum(mb.values()) / bw:.1f} us at copy "
          "bandwidth; per 5 us from the layer's start: " + " ".join(f"{int(bins[i])}:{load[i] / 5 / bw * 100:.0f}%"
                                                               for i in range(len(load))))
