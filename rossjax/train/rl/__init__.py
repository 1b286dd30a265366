"""RL: GRPO (config, setup, step, losses, advantages, KL, aggregation, dynamic sampling),
agentic RL and the rollout history."""
