//! The rules the model judges by, as data: each with the section of the
//! InfiniBand Architecture Specification (vol. 1, release 1.x, ch. 9
//! "Transport layer", ch. 10 "Software transport interface") that states
//! it, and the rule in a sentence. A finding names its rule by `id`.
//!
//! Section numbers are the chapters' and sections' as the spec numbers
//! them; where a compliance statement's number is not given here it was
//! not checked against the text.

/// One rule.
#[derive(Debug)]
pub struct Rule {
    /// Short name (a finding's kind is `model:` and this).
    pub id: &'static str,
    /// Where the spec states it.
    pub section: &'static str,
    /// The rule.
    pub text: &'static str,
}

macro_rules! rules {
    ($($name:ident = $id:literal, $section:literal, $text:literal;)*) => {
        $(
            #[doc = $text]
            pub const $name: &Rule = &Rule { id: $id, section: $section, text: $text };
        )*
        /// Every rule.
        pub const ALL: &[&Rule] = &[$($name),*];
    };
}

rules! {
    EXECUTE_ONCE = "model:execute-once", "IBA 9.7.5.1 (PSN checks), 9.4 (operations)",
        "a request at the expected PSN is executed once, in PSN order; a duplicate, a request out of sequence and a request that fails a check write nothing";
    DUPLICATE = "model:duplicate", "IBA 9.7.5.2 (duplicate requests)",
        "a duplicate request is answered from the responder's record without being executed again: SEND and WRITE acknowledged again, READ read again, an atomic answered with its saved original value";
    SEQUENCE_NAK = "model:sequence-nak", "IBA 9.7.5.1 (invalid PSN: PSN sequence error), 9.7.6 (NAK codes)",
        "a request ahead of the expected PSN is not executed and is answered by a PSN sequence error NAK naming the expected PSN, once per gap";
    OP_SEQUENCE = "model:op-sequence", "IBA 9.7.5.1 (opcode sequence check), 9.9 (responder error classes)",
        "a packet out of its message's opcode sequence (a MIDDLE or LAST without FIRST, a new message inside another) is an invalid request: NAK, QP to Error";
    INVALID_REQUEST = "model:invalid-request", "IBA 9.7.5.1 (length and opcode checks), 9.4.5 (atomics: naturally aligned), 9.9 (class C)",
        "a request with a bad length (FIRST/MIDDLE not a full MTU, more than the MTU, WRITE bytes not its DMA length), a misaligned atomic or an opcode the QP does not take is an invalid request: NAK invalid request, QP to Error";
    REMOTE_ACCESS = "model:remote-access", "IBA 10.6 (memory keys: R_Key, PD, rights, bounds), 9.7.5.1 (R_Key check), 9.9 (class C)",
        "a READ, WRITE or atomic whose R_Key is not valid, of another PD, lacks the right or does not cover the range (a zero-length one is not checked) is a remote access error: NAK remote access error, QP to Error";
    RNR = "model:rnr", "IBA 9.7.5.1 (receive queue check), 9.7.6 (RNR NAK)",
        "a SEND, or a WRITE with immediate, that finds no receive WR is answered by an RNR NAK at its PSN and leaves nothing done";
    ACK = "model:ack", "IBA 9.7.6 (ACK generation: AckReq, coalescing, MSN)",
        "an ACK names a PSN the responder executed and the MSN of the messages completed up to it; one with AckReq set is acknowledged (ACKs may be coalesced)";
    READ_RESPONSE = "model:read-response", "IBA 9.4.3 (RDMA READ), 9.7.5.2 (duplicate READ)",
        "a READ is answered by its responses, one per MTU at consecutive PSNs from the request's (FIRST/MIDDLE/LAST or ONLY), carrying the region's bytes, the LAST or ONLY an MSN counting the READ (IBA 9.7.5.1.6)";
    ATOMIC = "model:atomic", "IBA 9.4.5 (atomic operations), 9.7.5.2 (duplicate atomics)",
        "an atomic is executed once and answered by an atomic ACK at its PSN with the original value and an MSN counting it; a duplicate gets the saved value";
    PLACEMENT = "model:placement", "IBA 1.5 (memory placement extensions: RDMA FLUSH, ATOMIC WRITE)",
        "an ATOMIC WRITE (8 aligned bytes, remote write on the QP and the key) places its 8 bytes once; a FLUSH (the rights of its placement type on the QP and the key) changes nothing; each is answered once executed by an empty READ response ONLY counting it in its MSN";
    REQUESTER = "model:requester", "IBA 9.7.4 (requester: ACK, coalesced ACK, implied NAK, NAK classes, retries), 10.8 (completions in posting order)",
        "a request completes successfully only when answered (its ACK, a later ACK past a SEND or WRITE, its last READ response, its atomic ACK), in posting order; an error NAK fails it with the matching status and the QP; unanswered ones fail when retries run out; the rest are flushed";
    RECEIVE = "model:receive", "IBA 10.8 (work completions), 9.4.1 (SEND), 9.4.2 (WRITE with immediate), 10.6.7 (SEND with Invalidate)",
        "each message that consumes a receive WR completes it once, in order, with its opcode, length, immediate data and invalidated key";
    FLUSH = "model:flush", "IBA 10.3.1 (QP state Error), 10.8",
        "a QP that enters Error completes the receive WRs still posted with flush errors, after the one in progress";
    QP_STATE = "model:qp-state", "IBA 10.3.1 (QP states), 9.9 (responder error classes)",
        "the QP leaves RTS only for Error, and only on an error that the spec makes fatal, or (UC, UD) for SQE on a local error of a post";
    UNEXPECTED_ANSWER = "model:unexpected-answer", "IBA 9.7.6 (ACK/NAK), 9.8 (UC: no responses), 9.8 (UD: no responses)",
        "a responder answers only what the spec has it answer: RC requests as above, never a UC or UD packet";
    UC = "model:uc", "IBA 9.8 (unreliable connection: PSN and opcode sequence)",
        "a UC packet out of sequence drops the message in progress; a FIRST or ONLY starts a new message at its PSN, a MIDDLE or LAST without FIRST is dropped; nothing is NAKed; a post goes out once as its packets and completes when sent, with its opcode and length (a local error: SQE, the rest flushed)";
    UD = "model:ud", "IBA 9.6 (packet checks: Q_Key), 10.2 (controlled Q_Keys), 9.8 (UD)",
        "a UD datagram is delivered only with the QP's Q_Key (a Q_Key with the high-order bit set is compared as it is, not replaced), within the MTU, to a posted receive WR; its completion carries the source QP and the length with the 40-byte GRH; a post is one SEND ONLY datagram from the QP, completed when sent (a local error: SQE, the rest flushed)";
}

/// The rule named `id`.
pub fn find(id: &str) -> Option<&'static Rule> {
    ALL.iter().copied().find(|r| r.id == id)
}
