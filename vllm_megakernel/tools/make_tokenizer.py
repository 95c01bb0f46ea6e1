"""Writes a byte-level tokenizer with Cohere Command's special tokens, for serving without the real checkpoint.

    python -m vllm_megakernel.tools.make_tokenizer CONFIG_DIR

reads ``vocab_size`` from ``CONFIG_DIR/config.json`` and writes ``tokenizer.json``, ``tokenizer_config.json``
and ``special_tokens_map.json`` beside it. Every id below ``vocab_size`` decodes to something: bytes are
tokens of their own, Cohere's special tokens sit at their Command-R ids (``<|END_OF_TURN_TOKEN|>`` = 255001
is the model's eos) when the vocabulary is that large, and the rest are ``<unused_N>`` placeholders, so a
sampled id never breaks detokenisation. Text round-trips exactly (any UTF-8 string encodes to its bytes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# Command-R / Command-A token ids; the low ids follow config.json (pad 0, bos 2).
LOW_SPECIALS = {"<PAD>": 0, "<UNK>": 1, "<BOS_TOKEN>": 2, "<EOS_TOKEN>": 3}
TURN_SPECIALS = [
    "<|START_OF_TURN_TOKEN|>",  # 255000
    "<|END_OF_TURN_TOKEN|>",  # 255001: eos_token_id in config.json
    "<|YES_TOKEN|>",
    "<|NO_TOKEN|>",
    "<|GOOD_TOKEN|>",
    "<|BAD_TOKEN|>",
    "<|USER_TOKEN|>",
    "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    "<|START_RESPONSE|>",
    "<|END_RESPONSE|>",
    "<|START_ACTION|>",
    "<|END_ACTION|>",
    "<|START_TOOL_RESULT|>",
    "<|END_TOOL_RESULT|>",
    "<|START_TEXT|>",
    "<|END_TEXT|>",
]
COHERE_TURN_BASE = 255000
EOS_TOKEN = "<|END_OF_TURN_TOKEN|>"
FIRST_BYTE_ID = len(LOW_SPECIALS)

# Command-style chat template: system preamble (with tools), user/assistant turns, tool calls as
# <|START_ACTION|>json<|END_ACTION|>, tool results as <|START_TOOL_RESULT|> in a system turn, and answers
# inside <|START_RESPONSE|>...<|END_RESPONSE|>, which is what vLLM's cohere_command parsers read.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set system = none -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- if system or tools -%}"
    "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>"
    "{%- if system -%}{{ system }}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if system %}\n\n{% endif -%}"
    "# Available tools\n{{ tools | tojson }}\n"
    "Call tools as <|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"NAME\", "
    "\"parameters\": {...}}]<|END_ACTION|>"
    "{%- endif -%}"
    "<|END_OF_TURN_TOKEN|>"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ message['content'] }}<|END_OF_TURN_TOKEN|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    "{%- if message.get('tool_calls') -%}"
    "<|START_ACTION|>["
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] -%}"
    "{\"tool_call_id\": {{ (call.get('id') or loop.index0|string) | tojson }}, "
    "\"tool_name\": {{ fn['name'] | tojson }}, \"parameters\": "
    "{%- if fn['arguments'] is string %} {{ fn['arguments'] }}{% else %} {{ fn['arguments'] | tojson }}"
    "{%- endif -%}}"
    "{%- if not loop.last %}, {% endif -%}"
    "{%- endfor -%}"
    "]<|END_ACTION|>"
    "{%- else -%}"
    "<|START_RESPONSE|>{{ message['content'] }}<|END_RESPONSE|>"
    "{%- endif -%}"
    "<|END_OF_TURN_TOKEN|>"
    "{%- elif message['role'] == 'tool' -%}"
    "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>"
    "[{\"tool_call_id\": {{ (message.get('tool_call_id') or '0') | tojson }}, "
    "\"results\": {\"0\": {{ message['content'] | tojson }}}}]"
    "<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>"
    "{%- elif message['role'] == 'system' -%}"
    "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{ message['content'] }}<|END_OF_TURN_TOKEN|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{%- endif -%}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what the ByteLevel pre-tokenizer emits)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def special_token_ids(vocab_size: int) -> dict[str, int]:
    ids = dict(LOW_SPECIALS)
    if vocab_size >= COHERE_TURN_BASE + len(TURN_SPECIALS):
        base = COHERE_TURN_BASE
    else:
        base = FIRST_BYTE_ID + 256  # small test vocabularies: right after the bytes
    if base + len(TURN_SPECIALS) > vocab_size:
        raise ValueError(
            f"vocab_size {vocab_size} is too small for {FIRST_BYTE_ID + 256 + len(TURN_SPECIALS)} "
            "byte and special tokens"
        )
    ids.update({tok: base + i for i, tok in enumerate(TURN_SPECIALS)})
    return ids


def build_tokenizer(vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = special_token_ids(vocab_size)
    by_id: dict[int, str] = {i: tok for tok, i in specials.items()}
    for b, ch in bytes_to_unicode().items():
        by_id[FIRST_BYTE_ID + b] = ch
    vocab = {by_id.get(i, f"<unused_{i}>"): i for i in range(vocab_size)}
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<UNK>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    # Plain-text prompts start with <BOS_TOKEN>, as the chat template's do.
    bos = ("<BOS_TOKEN>", specials["<BOS_TOKEN>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<BOS_TOKEN> $A", pair="<BOS_TOKEN> $A $B", special_tokens=[bos]
    )
    return tok, specials


def write_tokenizer(config_dir: Path) -> None:
    config = json.loads((config_dir / "config.json").read_text())
    vocab_size = config["vocab_size"]
    tok, specials = build_tokenizer(vocab_size)
    eos_id = config.get("eos_token_id")
    if specials.get(EOS_TOKEN) != eos_id and vocab_size >= COHERE_TURN_BASE:
        raise ValueError(f"config eos_token_id {eos_id} is not {EOS_TOKEN}={specials[EOS_TOKEN]}")
    tok.save(str(config_dir / "tokenizer.json"), pretty=False)
    special_map = {
        "bos_token": "<BOS_TOKEN>",
        "eos_token": EOS_TOKEN,
        "pad_token": "<PAD>",
        "unk_token": "<UNK>",
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.get("max_position_embeddings", 8192),
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "additional_special_tokens": TURN_SPECIALS,
        **special_map,
    }
    (config_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (config_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_dir", type=Path)
    args = parser.parse_args(argv)
    write_tokenizer(args.config_dir)


if __name__ == "__main__":
    main()
