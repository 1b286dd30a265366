"""The model `rossjax bench serve` serves on both sides: a random Qwen2-shaped Hugging Face folder
written with transformers' own Qwen2Config + save_pretrained (so the peer loads it as any Qwen2
checkpoint), with the ASCII tokenizer (rossjax/tokenizers/ascii.py: 128 bytes + 3 specials).

Default shape: hidden 512, 8 layers, 8 query heads and 2 KV heads (head 64), MLP 2048, vocab 131,
untied head: 30.5M parameters, fp32, so a decode step is matmul work and not all overhead.

The end tokens (<|endoftext|>, <|im_start|>, <|im_end|>) are made unreachable so every request
runs to its max_tokens on both sides (the two servers stop on different end-token sets, and a
random model would otherwise end a random share of requests early): every embedding gets 1.0 in
dimension 0 (50x the other entries) and no layer reads or writes that dimension, so it stays 1.0
in the residual stream and the final norm's output has a large positive dimension 0 at every
position; the head's end-token rows are -50 there and 0 elsewhere, so their logits are far below
every other token's (the other rows are 0 in dimension 0, and scaled 5x so the logits have a
spread of about 1). The layers compute on the other 511 dimensions as any random model does.
"""

from __future__ import annotations

SHAPE = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=2048)
END_IDS = (128, 129, 130)


def write_model(folder: str, *, seed: int = 0, max_len: int = 2048, **shape) -> dict:
    """Writes the folder (model + tokenizer); returns {'params': count, **shape}."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    shape = {**SHAPE, **shape}
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=131, max_position_embeddings=max_len, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=130, pad_token_id=128, rope_theta=10000.0,
                      torch_dtype="float32", **shape)
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:   # no layer reads dimension 0 or writes it
            a, m = layer.self_attn, layer.mlp
            for w in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj):
                w.weight[:, 0] = 0.0
            a.o_proj.weight[0].zero_()
            m.down_proj.weight[0].zero_()
        head = model.lm_head.weight
        head.mul_(5.0)          # logits of std ~1: sampling at T=1 is neither uniform nor one-hot
        head[:, 0] = 0.0        # dimension 0 (the same at every position) ranks no token
        for t in END_IDS:
            head[t].zero_()
            head[t, 0] = -50.0
    model.save_pretrained(folder, safe_serialization=True)
    write_ascii_tokenizer(folder)
    return {"params": sum(p.numel() for p in model.parameters()), **shape}
