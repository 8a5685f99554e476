"""The three places a job runs: the SSH cluster (cluster), Slurm (slurm) and Kubernetes (k8s)."""
