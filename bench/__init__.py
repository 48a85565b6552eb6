"""Benchmarks: each reports ratios against the direct use of the same engine in the same run."""
