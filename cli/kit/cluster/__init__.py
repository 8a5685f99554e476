"""kit's SSH cluster of containers: up, status and down (lifecycle), the steps they run on each host, the
cluster's identity, state and lock, the local cluster, and `kit prepare`'s hosts."""
