"""tiltlab: tilted empirical risk minimization on any array-API backend."""

__version__ = "0.1.0.dev0"
