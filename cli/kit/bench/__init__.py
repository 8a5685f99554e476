"""`kit bench`: the links between hosts (net), the figures and plots, and the jobs it runs (jobs)."""
