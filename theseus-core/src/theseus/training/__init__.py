"""Training: the trainer, its optimizers and schedules, and the data loader (``flywheel``)."""
