"""``kafka-monitor replay``'s engine: the job's state function run again over the event archive,
batch by batch, at the moments the job evaluated each bucket (docs/replay.md)."""
