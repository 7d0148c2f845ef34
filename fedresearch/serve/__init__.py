"""Serving processes: one alone, or a supervisor and its workers sharing a port; signals and stops."""
