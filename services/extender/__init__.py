"""kube-scheduler extender: cluster placement from the same D-MUG core as the node loop."""
