"""The alert rules: pure functions of (entity state, one observation, now) -> transitions."""
