//! Unreliable datagram QPs (being written).
