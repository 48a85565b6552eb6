"""The ``dss-platform`` backend: jobs on a remote platform that owns the GPUs."""
