"""``kafka-monitor replay``: the job's rules run again over the event archive with a given
config, and what they would have raised compared with what the job published (docs/replay.md).

Modules: ``diff`` (episodes and their differences, pure), ``report`` (the terminal table, the
JSON and the HTML page), ``command`` (the flags and the run)."""
