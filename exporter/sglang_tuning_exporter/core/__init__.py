"""The shared vocabulary every layer speaks: events, ranks and observations, the metric catalog,
versions, durations, limits and the log clock. Imports nothing of the package."""
