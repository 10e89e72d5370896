"""`diagnose` and `parse`: the pipeline run once over log files."""
