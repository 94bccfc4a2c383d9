"""What runs in the Ray actors of a rollout: the rollout workers (each a wrapped vector env and its
episode loop) and the policy service that batches a local model for them."""
