"""Runs built from the other packages: one simulation, a parameter sweep, a policy comparison."""
