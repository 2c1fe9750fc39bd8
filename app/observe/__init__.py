"""What operators look at: live numbers (live), cluster gauges (cluster), the console's pages (ops),
contracts (schemas)."""
