"""What runs in the Ray actors of a rollout: the rollout workers (each an env bank,
:mod:`agent_memory.rollout.bank`, and its episode loop) and the policy service that batches a local
model for them."""
