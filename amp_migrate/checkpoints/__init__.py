"""`amp-migrate convert-checkpoint`: Apex checkpoints to GradScaler state and back."""
