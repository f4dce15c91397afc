"""asv benchmark suite for tiltlab (see ``benchmarks/README.md``)."""
