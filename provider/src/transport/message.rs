//! What RC and UC share about SEND and RDMA WRITE messages (IBA ch. 9.7).

/// The payload length rule for a request packet, the same for RC and UC
/// (IBA ch. 9.7, the responder's length checks): every packet but the last of a message carries exactly the
/// path MTU; the last carries 1 to MTU bytes; an only packet 0 to MTU.
pub fn payload_length_ok(position: uroce_wire::Position, len: usize, mtu: usize) -> bool {
    use uroce_wire::Position;
    match position {
        Position::First | Position::Middle => len == mtu,
        Position::Last => (1..=mtu).contains(&len),
        Position::Only => len <= mtu,
    }
}
