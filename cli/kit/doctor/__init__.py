"""`kit doctor`: what is read on each host (read), judged (judge, network, slurm), and reported (check)."""
