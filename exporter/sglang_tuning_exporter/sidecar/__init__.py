"""`serve`: the live product (follow, scrape, evaluate, expose /metrics and the status page)."""
