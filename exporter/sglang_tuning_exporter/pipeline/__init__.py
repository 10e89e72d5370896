"""Observations -> sliding window -> the guide's signals, per rank (docs/signals.md). Pure."""
