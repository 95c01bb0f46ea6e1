"""Writes a realistic random checkpoint for a North Mini Code config (accuracy work needs one; vLLM's
``--load-format dummy`` fills every weight, norms included, from U(-1e-3, 1e-3), which makes router logits
nearly tie and activations collapse).

    python -m vllm_megakernel.tools.make_checkpoint CONFIG_DIR OUT_DIR --seed N [--num-layers L]

- HF weight names with per-expert keys (``mlp.experts.E.gate_proj.weight``), which vLLM's in-tree
  ``Cohere2MoeForCausalLM.load_weights`` reads directly and transformers fuses into ``gate_up_proj`` on load.
- Matrices ~ normal(0, std) (0.02 unless ``--std``), norm weights 1, stored in the config's dtype.
- Deterministic: each tensor has its own generator seeded from (seed, name), so the same seed gives the
  same bytes whatever the shard size or order.
- Written tensor by tensor into shards of ``--max-shard-gb``, so the 61 GB model never needs more host
  memory than one shard.
- ``--num-layers`` keeps the first L layers (same layer pattern), for shallow variants at full width.

OUT_DIR also receives config.json (with the overrides) and the tokenizer files found in CONFIG_DIR.
"""

from __future__ import annotations

import argparse
import json
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
COMPLETE_MARKER = ".complete"  # written last: a folder without it is an interrupted write


def is_complete(out_dir: Path) -> bool:
    return (Path(out_dir) / COMPLETE_MARKER).exists()


def tensor_specs(config: dict) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """Yields (name, shape, is_norm) in HF layout for every tensor of the checkpoint (reference.layer_shapes,
    split into per-expert keys)."""
    from vllm_megakernel.reference import ModelDims, hf_tensor_specs

    dims = ModelDims.from_config(config)  # refuses shared experts, LayerNorm and non-sigmoid routing
    i_moe = config["intermediate_size"]
    yield from hf_tensor_specs(dims, i_moe, config.get("prefix_dense_intermediate_size") or i_moe)


def make_tensor(name: str, shape: tuple[int, ...], is_norm: bool, seed: int, std: float,
                dtype: torch.dtype) -> torch.Tensor:
    if is_norm:
        return torch.ones(shape, dtype=dtype)
    gen = torch.Generator().manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 62))
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen).to(dtype)


def apply_overrides(config: dict, num_layers: int | None) -> dict:
    config = dict(config)
    if num_layers is not None:
        if not 1 <= num_layers <= config["num_hidden_layers"]:
            raise ValueError(f"--num-layers must be in 1..{config['num_hidden_layers']}")
        config["num_hidden_layers"] = num_layers
        for key in ("layer_types", "mlp_layer_types"):
            if config.get(key) is not None:
                config[key] = config[key][:num_layers]
    return config


def write_checkpoint(config_dir: Path, out_dir: Path, seed: int, std: float = 0.02,
                     num_layers: int | None = None, max_shard_gb: float = 2.0,
                     dtype: str | None = None) -> dict:
    from safetensors.torch import save_file

    config = apply_overrides(json.loads((config_dir / "config.json").read_text()), num_layers)
    if dtype is not None:
        config["torch_dtype"] = dtype
    torch_dtype = getattr(torch, config.get("torch_dtype", "bfloat16"))
    out_dir.mkdir(parents=True, exist_ok=True)
    max_bytes = int(max_shard_gb * (1 << 30))

    specs = list(tensor_specs(config))
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = 0
    shard_files: list[tuple[str, list[str]]] = []
    total_bytes = 0

    def flush() -> None:
        nonlocal shard, shard_bytes
        if not shard:
            return
        fname = f"model-{len(shard_files) + 1:05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        shard_files.append((fname, list(shard)))
        shard, shard_bytes = {}, 0

    for name, shape, is_norm in specs:
        t = make_tensor(name, shape, is_norm, seed, std, torch_dtype)
        nbytes = t.numel() * t.element_size()
        if shard and shard_bytes + nbytes > max_bytes:
            flush()
        shard[name] = t
        shard_bytes += nbytes
        total_bytes += nbytes
    flush()

    # Rename to the HF convention model-0000k-of-0000n once n is known.
    n = len(shard_files)
    weight_map = {}
    for k, (fname, names) in enumerate(shard_files, start=1):
        final = f"model-{k:05d}-of-{n:05d}.safetensors"
        (out_dir / fname).rename(out_dir / final)
        weight_map.update({name: final for name in names})
    index = {"metadata": {"total_size": total_bytes, "seed": seed, "std": std}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in TOKENIZER_FILES:
        if (config_dir / f).exists():
            shutil.copyfile(config_dir / f, out_dir / f)
    (out_dir / COMPLETE_MARKER).write_text(json.dumps({"seed": seed, "std": std, "num_layers": num_layers,
                                                       "dtype": dtype}) + "\n")
    return index


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--std", type=float, default=0.02)
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--max-shard-gb", type=float, default=2.0)
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                        help="storage dtype (default: the config's torch_dtype)")
    args = parser.parse_args(argv)
    index = write_checkpoint(args.config_dir, args.out_dir, args.seed, args.std, args.num_layers,
                             args.max_shard_gb, args.dtype)
    print(f"wrote {len(index['weight_map'])} tensors, {index['metadata']['total_size'] / 1e9:.2f} GB "
          f"to {args.out_dir}")


if __name__ == "__main__":
    main()
