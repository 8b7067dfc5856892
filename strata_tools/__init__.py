"""The operator tools: the `strata` command, the local stack, the benchmarks and the
notebook helpers (strata_tools/README.md). Nothing else in the repository imports it."""
