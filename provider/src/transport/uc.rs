//! Unreliable connected QPs (being written).
