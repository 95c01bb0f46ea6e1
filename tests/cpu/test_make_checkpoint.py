"""Random checkpoints: loadable names, the statistics asked for, and determinism per seed."""

import json

import torch
from safetensors.torch import load_file

from conftest import TINY_CONFIG
from vllm_megakernel.tools.make_checkpoint import main, write_checkpoint


def load_all(d):
    sd = {}
    for f in sorted(d.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return sd


def test_same_seed_same_tensors_whatever_the_sharding(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_checkpoint(TINY_CONFIG, a, seed=3)
    write_checkpoint(TINY_CONFIG, b, seed=3, max_shard_gb=0.0002)  # many small shards
    write_checkpoint(TINY_CONFIG, c, seed=4)
    sa, sb, sc = load_all(a), load_all(b), load_all(c)
    assert len(list(b.glob("*.safetensors"))) > 1
    assert sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.1.mlp.gate.weight"], sc["model.layers.1.mlp.gate.weight"])
    index = json.loads((b / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(sb)
    assert all((b / f).exists() for f in index["weight_map"].values())


def test_statistics_and_dtype(tmp_path):
    write_checkpoint(TINY_CONFIG, tmp_path, seed=0)
    sd = load_all(tmp_path)
    assert all(t.dtype == torch.bfloat16 for t in sd.values())  # the config's torch_dtype
    norms = [k for k in sd if k.endswith("layernorm.weight") or k == "model.norm.weight"]
    assert norms and all(torch.equal(sd[k], torch.ones_like(sd[k])) for k in norms)
    big = torch.cat([sd[k].float().flatten() for k in sd if k not in norms])
    assert abs(big.mean().item()) < 1e-3 and abs(big.std().item() - 0.02) < 1e-3
    assert "model.layers.1.mlp.experts.15.down_proj.weight" in sd and "model.layers.0.mlp.gate_proj.weight" in sd


def test_cli_with_layer_override_writes_a_consistent_config(tmp_path, capsys):
    main([str(TINY_CONFIG), str(tmp_path), "--seed", "1", "--num-layers", "2"])
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    sd = load_all(tmp_path)
    assert not any(k.startswith("model.layers.2.") for k in sd)
    assert (tmp_path / "tokenizer.json").exists()
    assert "wrote" in capsys.readouterr().out


def test_a_finished_write_is_marked_complete(tmp_path):
    from vllm_megakernel.tools.make_checkpoint import COMPLETE_MARKER, is_complete

    assert not is_complete(tmp_path)
    write_checkpoint(TINY_CONFIG, tmp_path, seed=0, num_layers=2)
    assert is_complete(tmp_path)
    assert json.loads((tmp_path / COMPLETE_MARKER).read_text())["num_layers"] == 2


def test_checkpoint_tensors_are_the_layer_shapes_split_and_load_back_into_them(tmp_path):
    """One source for the model's tensor shapes: reference.layer_shapes. The checkpoint writer splits them
    into HF tensors, Weights.from_hf_state_dict joins those back into exactly these shapes, Weights.random
    makes them, and benchmarks.sol counts their bytes."""
    from benchmarks.sol import ModelBytes
    from conftest import FULL_CONFIG
    from vllm_megakernel import reference as ref
    from vllm_megakernel.tools.make_checkpoint import tensor_specs

    write_checkpoint(TINY_CONFIG, tmp_path, seed=0, dtype="float32")
    config = json.loads((TINY_CONFIG / "config.json").read_text())
    dims = ref.ModelDims.from_config(config)
    loaded = ref.Weights.from_checkpoint(tmp_path, dims)
    made = ref.Weights.random(dims, 32, 96, "cpu", dtype=torch.float32)
    for layer in range(dims.num_layers):
        for name, shape in ref.layer_shapes(dims, 32, 96, layer).items():
            assert tuple(getattr(loaded.layers[layer], name).shape) == shape, (layer, name)
            assert tuple(getattr(made.layers[layer], name).shape) == shape, (layer, name)
    for name, shape in ref.model_shapes(dims).items():
        assert tuple(getattr(loaded, name).shape) == tuple(getattr(made, name).shape) == shape
    for cfg_dir in (TINY_CONFIG, FULL_CONFIG):
        cfg = json.loads((cfg_dir / "config.json").read_text())
        d = ref.ModelDims.from_config(cfg)
        i, di = cfg["intermediate_size"], cfg["prefix_dense_intermediate_size"]
        hf = sum(torch.Size(s).numel() for _, s, _ in tensor_specs(cfg))
        mb = ModelBytes.from_config(cfg)
        moe_layers = sum(1 for x in d.dense if not x)
        assert hf * 2 == mb.always + moe_layers * d.num_experts * mb.per_expert  # every byte, bf16
    assert ModelBytes.from_config(json.loads((FULL_CONFIG / "config.json").read_text())).per_expert == 3 * 2048 * 768 * 2
