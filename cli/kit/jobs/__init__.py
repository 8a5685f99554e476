"""What every back end's job shares: the ranks' variables (env), the launchers' commands, the notes kept of a
scheduler's jobs, and the demo's summary."""
