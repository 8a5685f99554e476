"""Jobs on kit's SSH cluster: `kit run` (run), following and stopping them (control), their records,
and the supervisor that runs in the primary's container."""
