"""Adapters (one module per upstream), and the federation that runs them and fuses their results."""
