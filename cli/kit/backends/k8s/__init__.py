"""Jobs under Kubernetes: the manifests, applying and following them (jobs), each pod's size, and the
pod's task."""
