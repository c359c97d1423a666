"""Published numbers transcribed from the papers (CSV, one file per table)."""
