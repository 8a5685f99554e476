"""kit's own jobs for `kit bench`: run in the containers as a user's job is, from the workspace's kit-bench folder."""
