"""Jobs under Slurm: the sbatch script, submitting and following (jobs), its output, and the task srun
starts on each node."""
