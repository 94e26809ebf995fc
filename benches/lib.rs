//! Benchmarks live in [[bench]] targets.
