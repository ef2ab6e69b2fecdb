"""Contract suites: one set of tests, run against every adapter of a port."""
