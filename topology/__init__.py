"""Communication graphs, mixing weights, time-varying schedules and spectral analysis."""
