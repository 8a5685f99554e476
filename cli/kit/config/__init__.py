"""kit.yaml, hosts.txt and flags, validated: the settings (settings), and each section's own (build,
cluster, slurm), and the hosts (hosts)."""
