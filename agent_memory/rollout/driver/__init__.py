"""The driver's side of a rollout (the process that runs ``scripts/rollout.py`` or the trainer):
configs checked, episodes handed out and taken back, rows written."""
