"""The tunix side of `rossjax bench grpo --peer tunix`, run by the tunix environment's python.

Self-contained (imports tunix, never rossjax: tunix pins other transformers/tokenizers versions,
so it may live in a venv of its own). Reads a JSON spec on argv[1] (the model folder written by
the parent, the rendered prompts, sizes, learning rate), trains tunix's GRPOLearner with the
vanilla rollout engine on one CPU device, and prints one JSON line: the seconds of each step
(from the end of one global step of the learner to the end of the next).
"""

import json
import sys
import time


def digit_share(text: str) -> float:
    return sum(c.isdigit() for c in text) / max(1, len(text))


def main(spec_path: str) -> int:
    import jax
    import numpy as np
    import optax
    from flax import nnx
    from transformers import AutoTokenizer
    from tunix.models.qwen2 import model as qwen2, params as qwen2_params
    from tunix.rl import rl_cluster as rl
    from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner
    from tunix.rl.rollout import base_rollout

    spec = json.load(open(spec_path))
    hf = json.load(open(f"{spec['folder']}/config.json"))
    cfg = qwen2.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"], rope_theta=int(hf["rope_theta"]),
        norm_eps=hf["rms_norm_eps"], use_tied_embedding=hf["tie_word_embeddings"])
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    actor = qwen2_params.create_model_from_safe_tensors(spec["folder"], cfg, mesh)
    reference = qwen2_params.create_model_from_safe_tensors(spec["folder"], cfg, mesh)
    tok = AutoTokenizer.from_pretrained(spec["folder"])
    rows = spec["contexts"]
    longest = max(len(tok(p)["input_ids"]) for p in spec["prompts"])
    cluster = rl.RLCluster(
        actor=actor, reference=reference, tokenizer=tok,
        cluster_config=rl.ClusterConfig(
            role_to_mesh={rl.Role.ACTOR: mesh, rl.Role.REFERENCE: mesh, rl.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl.RLTrainingConfig(
                actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
                    spec["lr"], b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.0)),
                eval_every_n_steps=10_000, max_steps=spec["steps"], mini_batch_size=rows,
                train_micro_batch_size=rows),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=spec["new_tokens"], temperature=1.0, top_p=1.0,
                top_k=None, max_prompt_length=longest,
                kv_cache_size=longest + spec["new_tokens"] + 8,
                eos_tokens=[tok.convert_tokens_to_ids("<|im_end|>")])))
    learner = GRPOLearner(
        rl_cluster=cluster, reward_fns=[lambda prompts, completions, **_: [
            digit_share(c) for c in completions]],
        algo_config=GRPOConfig(num_generations=spec["group"], num_iterations=1, beta=0.0,
                               epsilon=0.2, loss_agg_mode="token-mean"))
    # A step ends when the learner's global step returns (its loop then syncs weights, a no-op
    # here: the rollout shares the actor's mesh); stamps between ends are the steps' times.
    stamps = [time.perf_counter()]
    run_step = learner._run_global_step

    def timed(*a, **k):
        out = run_step(*a, **k)
        jax.block_until_ready(nnx.state(actor))
        stamps.append(time.perf_counter())
        return out

    learner._run_global_step = timed
    learner.train({"prompts": np.asarray(spec["prompts"][s * rows:(s + 1) * rows])}
                  for s in range(spec["steps"]))
    print(json.dumps({"times": [b - a for a, b in zip(stamps, stamps[1:])],
                      "tunix": __import__("importlib.metadata").metadata.version("google-tunix"),
                      "jax": jax.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
