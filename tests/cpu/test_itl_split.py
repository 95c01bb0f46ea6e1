"""benchmarks.itl_split: a serving run's inter-token latencies split into decode steps and prefill interruptions."""

import json
import tarfile
from pathlib import Path

import pytest

from benchmarks import itl_split

REPO = Path(__file__).resolve().parents[2]
AL = REPO / "benchmarks" / "results" / "h100-2026-12-05-session-al"


def test_split_counts_itls_of_three_times_the_median_as_interruptions():
    # two requests, ITLs in seconds: median 10 ms; 30 ms is exactly 3x (an interruption), 29 ms is not
    s = itl_split.split([[0.010, 0.010, 0.029], [0.010, 0.030, 0.010]])
    assert s["tokens"] == 6
    assert s["interruptions"] == 1
    assert s["decode_ms"] == pytest.approx((10 * 4 + 29) / 5)
    assert s["interruption_ms_per_token"] == pytest.approx(30 / 6)
    assert s["mean_ms"] == pytest.approx((10 * 4 + 29 + 30) / 6)


def test_split_refuses_a_level_with_no_tokens():
    with pytest.raises(ValueError, match="no inter-token latencies"):
        itl_split.split([[], []])


def test_table_names_the_missing_bench_file():
    benches = {"bench-stock-c1.json": {"itls": [[0.005, 0.005]]}}
    with pytest.raises(KeyError, match="bench-megakernel-c1.json"):
        itl_split.table(benches, [1], {})


def test_sweep_step_is_the_median_per_request_rate():
    results = {"cases": [{"side": "stock", "batch": 8, "status": "ok", "per_request_tok_s": [80.0, 100.0, 125.0]},
                         {"side": "megakernel", "batch": 8, "status": "failed", "per_request_tok_s": [1.0]}]}
    assert itl_split.sweep_steps_ms(results) == {("stock", 8): pytest.approx(10.0)}


def test_reads_loose_files_an_archive_and_a_packed_folder_alike(tmp_path):
    bench = {"itls": [[0.004, 0.004, 0.02]]}
    folder = tmp_path / "serve"
    folder.mkdir()
    for side in itl_split.SIDES:
        (folder / f"bench-{side}-c1.json").write_text(json.dumps(bench))
    archive = tmp_path / "bench.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for p in sorted(folder.iterdir()):
            tar.add(p, arcname=p.name)
    assert itl_split.load_benches(folder) == itl_split.load_benches(archive)
    assert itl_split.table(itl_split.load_benches(archive), [1], {}).count("| 1 of 3 |") == 2
    packed = tmp_path / "packed"  # a results folder: the files only in its bench.tar.xz
    packed.mkdir()
    archive.rename(packed / "bench.tar.xz")
    assert itl_split.load_benches(packed) == itl_split.load_benches(folder)
    loose = {"itls": [[0.004, 0.004]]}  # a loose file wins over the packed one of its name
    (packed / "bench-stock-c1.json").write_text(json.dumps(loose))
    assert itl_split.load_benches(packed) == {"bench-stock-c1.json": loose, "bench-megakernel-c1.json": bench}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert itl_split.load_benches(empty) == {}


def test_reproduces_session_als_committed_table(capsys):
    itl_split.main(["--bench", str(AL / "serve-8192" / "bench.tar.xz"),
                    "--sweep", str(AL / "sweep-b1-8" / "sweep" / "results.json")])
    assert capsys.readouterr().out == (AL / "itl_split.md").read_text()
