"""Metrics of every process of a run, exported through Ray's metrics system to Prometheus.

``families`` lists every metric (name, kind, labels, meaning); ``recorder`` records them in the
process that observes them (a no-op without Ray or with ``ARCTIC_RL_METRICS=0``);
``discovery`` writes the Prometheus targets of a cluster's nodes; ``prometheus`` starts a
Prometheus server next to a running Arctic RL server.
"""
